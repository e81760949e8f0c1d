"""The house rules of ARCHITECTURE.md: every module sits in a layer, and no import runs upward.

A new module must be added to LAYERS below (and to ARCHITECTURE.md); a module importing one of a
higher layer, or the network layer importing anything but the base, fails here.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "src" / "logstore"

#: layer -> modules, bottom up (the order of ARCHITECTURE.md's table)
LAYERS: list[tuple[str, set[str]]] = [
    ("base", {"errors", "_fileio", "metrics", "checkpoint", "_native"}),
    ("records", {"arrowread", "codecbase", "xerial", "lz4frame", "zstdframe", "compression", "config", "records", "batching",
                 "offsets", "groupmetadata"}),
    ("segment", {"index", "segmentnames", "activation", "segmentrecovery", "truncation", "pointread", "segment"}),
    ("log", {"logsegments", "logarrow", "logloader", "logappends", "logtruncation", "retention", "flusher", "shared", "waiters",
             "epochs", "producerstate", "logproducers", "cleaner", "loglifecycle", "logmetrics", "logreplication", "log"}),
    ("store", {"store", "logdirs", "logview"}),
    ("net", {"workerpool", "netprotocol", "net", "purgatory"}),
    ("kafka", {"kafkawriter", "kafkabounds", "kafkawire", "kafkagroups", "kafkaconfigs", "kafkaapis", "kafkaproducerids",
               "kafkacredentials", "kafkaauth", "kafkaserver", "kafkaclient", "groupclient"}),
    ("client", {"groupservice", "producer", "consumer", "workqueue"}),
    ("replication", {"replica_kafka", "replica_peerapis", "election", "replica_partition", "replica_election", "replica_leader", "replica_follower",
                     "replication_client", "replication"}),
    ("apps", {"sparkoptions", "sparkplan", "sparkread", "sparkwrite", "spark", "sparkenv", "cli", "tools", "progress",
              "testing", "mirror", "__main__", "__init__"}),
]
#: modules of these layers may import only what is listed (the network layer knows no logs)
ONLY: dict[str, set[str]] = {"net": {"base", "net"}}


def _layer_of(module: str) -> int:
    for rank, (_, modules) in enumerate(LAYERS):
        if module in modules:
            return rank
    raise AssertionError(f"module logstore.{module} is in no layer: add it to LAYERS in {__file__} "
                         "and to ARCHITECTURE.md")


def _imports(path: pathlib.Path) -> set[str]:
    """The logstore modules ``path`` imports, at module level or inside functions."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                out.add(node.module.split(".")[0])
            else:
                out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("logstore."):
            out.add(node.module.split(".")[1])  # type: ignore[union-attr]
    return out


MODULES = sorted(p for p in PACKAGE.glob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=[p.stem for p in MODULES])
def test_no_import_runs_upward(path: pathlib.Path) -> None:
    module = path.stem
    rank = _layer_of(module)
    layer = LAYERS[rank][0]
    for imported in sorted(_imports(path)):
        other = _layer_of(imported)
        assert other <= rank, (f"logstore.{module} ({layer}) imports logstore.{imported} "
                               f"({LAYERS[other][0]}), a higher layer")
        if layer in ONLY:
            assert LAYERS[other][0] in ONLY[layer], (
                f"logstore.{module} ({layer}) may import only {sorted(ONLY[layer])}, not logstore.{imported}")


@pytest.mark.parametrize("path", MODULES, ids=[p.stem for p in MODULES])
def test_module_docstring_says_what_it_holds(path: pathlib.Path) -> None:
    doc = ast.get_docstring(ast.parse(path.read_text()))
    assert doc and doc.strip().splitlines()[0].strip(), f"logstore.{path.stem} has no module docstring"
