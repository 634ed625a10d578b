"""serve_app/ingress/gate/publisher.py: each model's rates, as the HAProxy gate's map entries."""

from __future__ import annotations

from pathlib import Path

import pytest

from serve_app.config import AdmissionConfig, AppArgs
from serve_app.ingress.gate import publisher as publisher_module
from serve_app.ingress.gate.haproxy import MAPS
from serve_app.ingress.gate.publisher import (
    Publisher,
    RefusalCounts,
    commands,
    entries,
    map_values,
    prepare,
    write_maps,
)
from serve_app.stages.tokenizer import TokenizerStage
from tests.unit.admission_support import gated


async def at_root() -> bool:
    return True


def test_the_values_are_the_work_gates_rates_in_nanoseconds(app_args: AppArgs, tokenizer_stage: TokenizerStage) -> None:
    services = gated(app_args, tokenizer_stage)
    assert services.work is not None
    per_char = services.work.tokens_per_char / 1000
    assert map_values(services) == {"wait_ns": 4_500_000_000, "char_ns": int(per_char * 1e9),
                                    "token_ns": 10_000_000, "max_tokens": app_args.model.max_model_len,
                                    "max_n": app_args.limits.max_n, "status": 429, "retry_after": 7}  # fmt: skip


def test_a_model_admitted_by_count_is_not_gated(app_args: AppArgs, tokenizer_stage: TokenizerStage) -> None:
    by_count = gated(app_args, tokenizer_stage, AdmissionConfig())
    assert map_values(by_count) is None
    by_map = entries([by_count])
    assert by_map == {name: {} for name in MAPS}  # every map committed empty
    assert commands(Path("/g"), by_map, dict.fromkeys(MAPS, "1")).startswith("commit map @1 /g/wait_ns.map; ")


def test_each_map_is_filled_in_a_new_version_and_committed_whole(
    app_args: AppArgs, tokenizer_stage: TokenizerStage
) -> None:
    by_map = entries([gated(app_args, tokenizer_stage)])
    assert prepare(Path("/g"), by_map).startswith("prepare map /g/wait_ns.map; prepare map /g/char_ns.map; ")
    line = commands(Path("/g"), by_map, {name: str(i) for i, name in enumerate(by_map)})
    name = app_args.model.name
    assert line.startswith(f"add map @0 /g/wait_ns.map {name} 4500000000; commit map @0 /g/wait_ns.map; ")
    assert line.endswith(f"add map @6 /g/retry_after.map {name} 7; commit map @6 /g/retry_after.map; "
                         "show table serve_graph_in_flight\n")  # fmt: skip


def test_refusals_are_counted_per_model_across_haproxy_reloads() -> None:
    counts = RefusalCounts()
    table = "# table: serve_graph_in_flight, type: string, size:10240, used:2\n"
    line = "0x7f: key={} use=0 exp=0 shard=0 gpc0={}\n"
    assert counts.new(table + line.format("a/32", 5) + line.format("a/1", 1) + line.format("b/4", 0)) == {"a": 6}
    assert counts.new(table + line.format("a/32", 9) + line.format("a/1", 1)) == {"a": 4}
    assert counts.new(table + line.format("a/32", 2)) == {"a": 2}  # reloaded: counting from zero again
    assert counts.new(table) == {}


def test_the_map_files_hold_the_last_rates_for_a_reload(
    tmp_path: Path, app_args: AppArgs, tokenizer_stage: TokenizerStage
) -> None:
    write_maps(tmp_path, entries([gated(app_args, tokenizer_stage)]))
    assert (tmp_path / "wait_ns.map").read_text() == f"{app_args.model.name} 4500000000\n"


async def test_one_ingress_replica_of_a_node_publishes(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO")
    first, second = (Publisher(tmp_path / "admin.sock", [], at_root) for _ in range(2))
    await first.step()
    assert "no HAProxy admission gate" in caplog.text  # no map files: not gated
    (tmp_path / "wait_ns.map").touch()
    await first.step()  # holds the node's lock; HAProxy is not there to answer
    assert "publishing to the gate's HAProxy" in caplog.text and "failed" in caplog.text
    await second.step()
    assert "another ingress replica publishes" in caplog.text


async def test_the_map_files_are_rewritten_when_the_rates_change_at_most_every_files_period(
    tmp_path: Path, app_args: AppArgs, tokenizer_stage: TokenizerStage, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes: list[dict[str, dict[str, int]]] = []
    monkeypatch.setattr(publisher_module, "write_maps", lambda gate_dir, by_map: writes.append(by_map))
    (tmp_path / "wait_ns.map").touch()
    services = gated(app_args, tokenizer_stage)
    assert services.work is not None
    publisher = Publisher(tmp_path / "admin.sock", [services], at_root)
    await publisher.step()  # HAProxy does not answer; the files are written all the same
    assert writes == [entries([services])]
    services.work.learn(10_000, 100)  # a new rate a character
    await publisher.step()
    assert len(writes) == 1  # within FILES_PERIOD_S of the last write
    monkeypatch.setattr(publisher_module, "FILES_PERIOD_S", 0.0)
    await publisher.step()
    await publisher.step()  # the same rates: not rewritten
    assert writes[1:] == [entries([services])] and writes[1] != writes[0]


async def test_an_application_under_a_route_prefix_does_not_publish(
    tmp_path: Path, app_args: AppArgs, tokenizer_stage: TokenizerStage, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO")
    asked = 0

    async def under_prefix() -> bool:
        nonlocal asked
        asked += 1
        return False

    (tmp_path / "wait_ns.map").touch()
    publisher = Publisher(tmp_path / "admin.sock", [gated(app_args, tokenizer_stage)], under_prefix)
    await publisher.step()
    await publisher.step()
    assert "not at route `/`" in caplog.text and asked == 1
    assert (tmp_path / "wait_ns.map").read_text() == "" and not (tmp_path / "publisher.lock").exists()
