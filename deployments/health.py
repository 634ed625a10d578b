"""The graph's `/health` application: `serve_app.graph_health` in a replica of its own.

`import_path: deployments.health:build_health_app`, `route_prefix: /health`, with `args.applications`
naming the applications whose ingress it polls (their `health_report` method).
"""

from __future__ import annotations

from typing import Any, cast

import ray
from ray import serve
from ray.serve import Application, Deployment

from serve_app.graph_health import GraphHealthApp, GraphHealthArgs, Report
from serve_app.ingress.gate.admin import admin_socket, publish_health
from serve_app.strict_args import parse_args


@serve.deployment(name="health", num_replicas=1, max_ongoing_requests=1000, ray_actor_options={"num_cpus": 0})
@serve.ingress()
class Health:
    def __init__(self, args: GraphHealthArgs) -> None:
        def report_of(app: str) -> Any:
            # Not checked against the controller now (a blocking call, and the application may be deployed
            # after this one): until it exists, each poll's call fails or times out, and /health says so.
            handle = serve.get_deployment_handle("ingress", app_name=app, _check_exists=False)

            async def report() -> Report:
                ok, stages = await handle.health_report.remote()
                return bool(ok), dict(stages)

            return report

        # The stamp that lets this node's HAProxy answer a green /health (serve_app/ingress/gate/).
        socket = admin_socket(ray.get_runtime_context().get_node_id())
        reports = {app: report_of(app) for app in args.applications}
        self._app = GraphHealthApp(args, reports, lambda until_ms: publish_health(socket, until_ms))

    def __serve_build_asgi_app__(self) -> GraphHealthApp:
        return self._app


def build_health_app(args: dict[str, Any]) -> Application:
    health_args = parse_args(GraphHealthArgs, args)
    return cast(Deployment, Health).bind(health_args)
