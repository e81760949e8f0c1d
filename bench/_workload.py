"""The benchmark workload, shared by the pytest-benchmark suite (bench/bench_*.py) and compare.py.

Values are compact JSON event documents of *exactly* the requested size, each one different
(ids, timestamps, paths, user agents and a free-text field vary; the free-text field absorbs the
difference to the exact size). Keys are 16 random bytes (a UUID's worth). Everything is drawn
from a seeded RNG, so two runs compress and encode the same bytes.

Also here: a description of the machine, printed by both entry points, and a scratch directory
helper that keeps benchmark data on the filesystem named by ``LOGSTORE_BENCH_DIR`` (default: the
system temporary directory) and removes it afterwards.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
from typing import Iterator

KEY_SIZE = 16

_WORDS = (
    "the order was shipped to customer after payment confirmation and stock check "
    "delivery window updated because warehouse reported delay on carrier pickup "
    "user requested refund for damaged item photo attached ticket escalated to support "
    "session resumed from mobile app push notification opened cart restored with coupon"
).split()
_EVENTS = ("page_view", "add_to_cart", "checkout", "purchase", "refund", "login", "search", "logout")
_PATHS = ("/", "/search", "/cart", "/checkout", "/account/orders", "/products/{}", "/category/{}/items")
_COUNTRIES = ("DE", "FR", "US", "GB", "JP", "BR", "IN", "NL", "SE", "ES")
_AGENTS = (
    "Mozilla/5.0 (X11; Linux x86_64) Firefox/128.0",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) Mobile/15E148",
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) Chrome/126.0.0.0",
    "okhttp/4.12.0",
)


def _document(rng: random.Random, i: int) -> dict:
    ts = 1_717_000_000_000 + i * 37 + rng.randrange(1000)
    path = rng.choice(_PATHS).format(rng.randrange(1, 99999))
    return {
        "id": f"{rng.getrandbits(64):016x}",
        "type": rng.choice(_EVENTS),
        "ts": ts,
        "user": {"id": rng.randrange(1, 10_000_000), "country": rng.choice(_COUNTRIES)},
        "path": path,
        "amount": round(rng.uniform(1, 500), 2),
        "session": f"{rng.getrandbits(96):024x}",
        "ua": rng.choice(_AGENTS),
        "items": [rng.randrange(1, 99999) for _ in range(rng.randrange(1, 6))],
        "ab": rng.choice(("control", "variant-a", "variant-b")),
    }


def json_value(rng: random.Random, i: int, size: int) -> bytes:
    """One compact JSON object of exactly ``size`` bytes (size >= 24)."""
    if size < 24:
        raise ValueError("values shorter than 24 bytes cannot hold a JSON event")
    doc = _document(rng, i)
    out: dict = {}
    # Take fields in order while they leave room for a non-empty free-text field.
    for name, value in doc.items():
        trial = dict(out, **{name: value})
        if len(json.dumps(trial, separators=(",", ":"))) + len(',"msg":"x"') > size:
            break
        out = trial
    out["msg"] = ""
    room = size - len(json.dumps(out, separators=(",", ":")))
    words: list[str] = []
    length = -1
    while length < room:
        words.append(rng.choice(_WORDS))
        length += len(words[-1]) + 1
    text = " ".join(words)[:room]
    out["msg"] = text[:-1] + "s" if text.endswith(" ") else text
    data = json.dumps(out, separators=(",", ":")).encode()
    assert len(data) == size, (len(data), size)
    return data


def make_values(n: int, size: int, seed: int = 1) -> list[bytes]:
    rng = random.Random(seed * 1_000_003 + size)
    return [json_value(rng, i, size) for i in range(n)]


def make_keys(n: int, seed: int = 2) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.getrandbits(8 * KEY_SIZE).to_bytes(KEY_SIZE, "big") for _ in range(n)]


def chunks(values: list[bytes], keys: list[bytes], batch: int) -> list[tuple[list[bytes], list[bytes]]]:
    """Split the pool into batches of ``batch`` (the pool length must be a multiple)."""
    assert len(values) % batch == 0 and len(values) == len(keys)
    return [(values[i : i + batch], keys[i : i + batch]) for i in range(0, len(values), batch)]


# ---------------------------------------------------------------------- machine
def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _filesystem(path: str) -> str:
    try:
        out = subprocess.run(["df", "-T", path], capture_output=True, text=True, timeout=5).stdout
        fields = out.splitlines()[1].split()
        return f"{fields[1]} ({fields[0]})"
    except Exception:
        return "unknown"


def bench_root() -> str:
    return os.environ.get("LOGSTORE_BENCH_DIR") or tempfile.gettempdir()


def _source_version() -> str:
    """The commit measured, and whether src/ had uncommitted changes."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        head = subprocess.run(["git", "-C", repo, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "-C", repo, "status", "--porcelain", "--", "src"], capture_output=True,
                               text=True, timeout=5).stdout.strip()
    except Exception:
        return "unknown"
    return f"{head}{' + uncommitted changes in src/' if dirty else ''}" if head else "unknown"


def machine() -> dict[str, str]:
    root = bench_root()
    try:
        mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        mem_gib = float("nan")
    from logstore._native import lib

    return {
        "cpu": _cpu_model(),
        "cores": str(os.cpu_count()),
        "memory": f"{mem_gib:.1f} GiB",
        "crc32c": "SSE4.2" if lib.ls_crc32c_hw_available() else "table (no SSE4.2)",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "os": f"{platform.system()} {platform.release()}",
        "data dir": f"{root} on {_filesystem(root)}",
        "logstore": _source_version(),
    }


def machine_lines() -> list[str]:
    return [f"{k:>9}: {v}" for k, v in machine().items()]


@contextlib.contextmanager
def scratch_dir(prefix: str = "logstore-bench-") -> Iterator[str]:
    path = tempfile.mkdtemp(prefix=prefix, dir=bench_root())
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def fmt_rate(x: float) -> str:
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    if x >= 1e3:
        return f"{x / 1e3:.1f}k"
    return f"{x:.0f}"


if __name__ == "__main__":  # a look at the data
    for size in (100, 200, 1000):
        v = make_values(3, size)
        print(size, [len(x) for x in v])
        print(v[0].decode())
        json.loads(v[0])
    print("\n".join(machine_lines()), file=sys.stderr)
