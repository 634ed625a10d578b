"""Pure-ASGI layers in front of the routes: API keys, body size, admission (count and work), route paths."""
