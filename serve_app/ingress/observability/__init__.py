"""What the ingress reports about itself and its stages: health checks and Prometheus metrics."""
