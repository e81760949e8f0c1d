"""``import logstore`` and the ``logstore`` command load no heavy dependency they do not use.

kio (the Kafka codec: about 300 ms, as it imports hypothesis), pyarrow and pyspark load when
first used; so does the group client, which needs kio. Each check runs in a fresh interpreter
and looks at ``sys.modules``: a timing would be at the mercy of the machine's load.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

HEAVY = ("kio", "pyarrow", "pyspark", "logstore.client.groupservice", "logstore.errorcodes")


def _loaded_after(code: str, cwd: str | os.PathLike[str] | None = None) -> list[str]:
    """The HEAVY modules loaded once ``code`` has run in a fresh interpreter."""
    probe = (f"{code}\nimport sys, json\n"
             f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r} or m in {HEAVY!r})))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=cwd)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])  # type: ignore[no-any-return]


def test_import_logstore_loads_no_heavy_dependency() -> None:
    assert _loaded_after("import logstore") == []


def test_the_pytest_plugin_loads_the_kafka_codec_only_for_its_fixtures() -> None:
    assert _loaded_after("import logstore.testing") == []


@pytest.mark.parametrize("argv", [["--help"], ["topics", "list", "{root}"], ["stats", "{root}"]],
                         ids=["help", "topics-list", "stats"])
def test_local_commands_load_no_heavy_dependency(tmp_path, argv) -> None:
    from logstore import LogStore

    root = tmp_path / "store"
    with LogStore(root, maintenance=False) as store:
        store.create_topic("events", 2)
        store.partition("events", 0).append(b"hello")
    args = [a.format(root=root) for a in argv]
    code = (f"import contextlib, io\nfrom logstore.cli import main\n"
            f"with contextlib.redirect_stdout(io.StringIO()):\n    assert main({args!r}) == 0")
    assert _loaded_after(code) == []


def test_a_consumer_of_an_unshared_store_loads_no_group_client(tmp_path) -> None:
    code = (f"from logstore import LogStore\n"
            f"with LogStore({str(tmp_path)!r}, shared=False, maintenance=False) as store:\n"
            f"    store.create_topic('t')\n"
            f"    store.producer().send('t', b'x').result()\n"
            f"    assert [r.value for r in store.consumer('g', 't').poll(1.0)] == [b'x']")
    assert _loaded_after(code) == []


def test_public_names_resolve_on_first_use() -> None:
    import logstore

    for name in logstore.__all__:
        assert getattr(logstore, name) is not None, name
    assert logstore.KafkaServer.__module__ == "logstore.kafka.server"
    assert set(logstore.__all__) <= set(dir(logstore))
    with pytest.raises(AttributeError):
        logstore.no_such_name  # noqa: B018
