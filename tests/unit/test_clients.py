"""serve_app/ingress/pipeline/clients.py: the ingress reaches the stages through Protocols, without importing them."""

from __future__ import annotations

import subprocess
import sys

# What only the stages need: image decoding, the tokenizers, the engine, the codec.
STAGE_LIBRARIES = ("PIL", "transformers", "torch", "vllm", "snac")


def test_the_ingress_deployment_imports_no_stage_library() -> None:
    code = "import sys, deployments.ingress; print(' '.join(sorted(sys.modules)))"
    modules = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.split()
    assert "deployments.ingress" in modules
    assert [m for m in STAGE_LIBRARIES if m in modules] == []
    assert [m for m in modules if m.startswith("serve_app.stages")] == []
