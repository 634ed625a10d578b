"""The request path behind the routes: the model's services, validation, admission by work, the stage
calls (generation.py numbers the steps), streams and responses."""
