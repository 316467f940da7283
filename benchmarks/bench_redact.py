"""The stream redactor's speed over real logs, against the redactor it replaced and against
the least any redaction can cost.

Every byte a cell prints passes ``secret_env.StreamRedactor`` (the live triage and the kept
log both read it redacted), so its cost is on the hot path. The stream is every real log
of tests/data (``*.log``) joined and repeated to ``--mb`` megabytes, fed in 64 KiB chunks,
with the host's secret values set as a run has them (an ``HF_TOKEN`` and a webhook secret)
and a few tokens of each well-known shape among the lines. The baseline, measured in the
same run: ``bytes.replace`` of each secret value over the whole joined stream at once (one
C pass per value, no chunking, no shapes); and ``EnvOnlyRedactor`` below, the stream
redactor as it was before token shapes were found (the environment's values only, matched
inside any word). Prints MB/s of each, the ratios, and what each left of the secrets.

    python benchmarks/bench_redact.py              # 64 MB, best of 3
    python benchmarks/bench_redact.py --quick      # 2 MB, once
"""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

import quick_mode

from repromatrix.secret_env import REDACTED, StreamRedactor

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
CHUNK = 64 << 10
QUICK = {"mb": 2, "repeat": 1}
SECRETS = {
    "HF_TOKEN": "hf_benchTokenAbCdEfGhIjKlMnOpQrStUvWx",
    "REPROMATRIX_WEBHOOK_SECRET": "whsec-bench-5f2a9c0e71",
}
# One line of each shape, spread through the stream (a token printed by a program).
SHAPED = (
    b"INFO hub: using token hf_ShapeTokenAbCdEfGhIjKlMnOpQrStUvWx12\n"
    b"DEBUG http: Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig\n"
    b"aws: AKIAIOSFODNN7EXAMPLE wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\n"
    b"git: ghp_abcdefghijklmnopqrstuvwxyzABCDEFGHIJ cloning https://bot:hunter22@example.com/r\n"
)

SHAPED_PARTS = (b"hf_Shape", b"eyJhbG", b"wJalrXUtn", b"ghp_abc", b"hunter22")


def stream(megabytes: float, shaped: bytes = SHAPED) -> bytes:
    """The real logs joined, with the secret lines among them (``shaped`` after each log),
    repeated to ``megabytes``."""
    logs = sorted(p for p in DATA.rglob("*.log"))
    one = b"".join(p.read_bytes() + shaped for p in logs)
    one += b"".join(f"token {value}\n".encode() for value in SECRETS.values())
    return (one * (int(megabytes * 1e6) // len(one) + 1))[: int(megabytes * 1e6)]


class Redactor(Protocol):
    """What a stream redactor does."""

    def feed(self, chunk: bytes) -> bytes:
        """The redacted bytes safe to pass on."""

    def flush(self) -> bytes:
        """What was kept back."""


class EnvOnlyRedactor:
    """The stream redactor before token shapes (as of f946100): the values of ``secrets``,
    anywhere, holding back only an end of the stream that begins one."""

    def __init__(self, secrets: Mapping[str, str]) -> None:
        self._values = sorted({v.encode() for v in secrets.values()}, key=len, reverse=True)
        self._pattern = re.compile(b"|".join(re.escape(v) for v in self._values))
        self._held = b""

    def feed(self, chunk: bytes) -> bytes:
        """As ``StreamRedactor.feed`` was."""
        data = self._held + chunk
        out: list[bytes] = []
        start = 0
        keep = None
        for match in self._pattern.finditer(data):
            rest = data[match.start() :]
            if any(len(v) > len(rest) and v.startswith(rest) for v in self._values):
                keep = len(data) - match.start()
                break
            out += [data[start : match.start()], REDACTED.encode()]
            start = match.end()
        if keep is None:
            keep = self._partial(data, start)
        out.append(data[start : len(data) - keep])
        self._held = data[len(data) - keep :]
        return b"".join(out)

    def flush(self) -> bytes:
        """As ``StreamRedactor.flush`` was."""
        held, self._held = self._held, b""
        return held

    def _partial(self, data: bytes, start: int) -> int:
        longest = max(len(v) for v in self._values) - 1
        for size in range(min(longest, len(data) - start), 0, -1):
            if any(v.startswith(data[len(data) - size :]) for v in self._values):
                return size
        return 0


def redactor_s(redactor: Redactor, data: bytes) -> tuple[float, bytes]:
    """Seconds to pass ``data`` through ``redactor`` in chunks, and what came out."""
    start = time.perf_counter()
    out = [redactor.feed(data[at : at + CHUNK]) for at in range(0, len(data), CHUNK)]
    out.append(redactor.flush())
    return time.perf_counter() - start, b"".join(out)


def baseline_s(data: bytes) -> float:
    """Seconds for one ``bytes.replace`` per secret value over the whole stream."""
    start = time.perf_counter()
    for value in SECRETS.values():
        data = data.replace(value.encode(), REDACTED.encode())
    return time.perf_counter() - start


def main() -> None:
    """Measure the redactor and the baseline in this run and print the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=64, help="megabytes of stream")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each; the best counts")
    args = quick_mode.parse_args(parser, QUICK)
    for what, shaped in (("with a token of each shape after each log", SHAPED), ("plain", b"")):
        data = stream(args.mb, shaped)
        print(f"{len(data) / 1e6:.1f} MB of real logs, {what}, in {CHUNK >> 10} KiB chunks,"
              f" best of {args.repeat}")  # fmt: skip
        measure(data, args.repeat)


def measure(data: bytes, repeat: int) -> None:
    """Both redactors and the baseline on ``data``: speeds, ratios, what each left."""
    mb = len(data) / 1e6
    speeds = {}
    for name, make in (("StreamRedactor", StreamRedactor), ("EnvOnlyRedactor", EnvOnlyRedactor)):
        runs = [redactor_s(make(SECRETS), data) for _ in range(repeat)]
        seconds, out = min(runs, key=lambda run: run[0])
        speeds[name] = mb / seconds
        left = sum(value.encode() in out for value in SECRETS.values())
        shaped = sum(shape in out for shape in SHAPED_PARTS)
        print(
            f"  {name + ':':26}{speeds[name]:8.1f} MB/s  values left {left}, shaped left {shaped}"
        )
    base = mb / min(baseline_s(data) for _ in range(repeat))
    print(f"  {'bytes.replace (baseline):':26}{base:8.1f} MB/s")
    ratio = speeds["StreamRedactor"] / speeds["EnvOnlyRedactor"]
    print(f"  ratio StreamRedactor / EnvOnlyRedactor speed: {ratio:.2f}")
    print(f"  ratio StreamRedactor / bytes.replace speed:   {speeds['StreamRedactor'] / base:.3f}")


if __name__ == "__main__":
    main()
