"""Thin Ray Serve deployments around the stage classes in `serve_app`; `graph.build_app` binds them."""
