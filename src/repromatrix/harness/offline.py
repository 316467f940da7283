#!/usr/bin/env python3
"""The harness's offline child: ``vllm.LLM(**kwargs)``, then one ``generate``.

Usage: ``python3 offline.py SPEC_JSON_PATH PROGRESS_JSON_PATH`` (started by
``harness.py`` in offline mode; its output is relayed like a server's). It
writes its progress to the second file as it goes, so the harness knows how
far it got even when vLLM kills the process: ``ready_s`` once ``LLM()``
returned, then ``request_s`` and ``answered`` after ``generate``. Standard
library only, besides the image's vLLM; Python 3.8 or later.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from typing import Any


def write_json(path: str, data: dict[str, Any]) -> None:
    """Write ``data`` to ``path`` atomically (readers see the old or the whole new file)."""
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(data, handle)
    os.replace(tmp, path)


def run(spec: dict[str, Any], progress_path: str) -> int:
    """Build the engine, generate once (through the LoRA adapter, if any), report progress."""
    started = time.monotonic()
    vllm: Any = importlib.import_module("vllm")
    llm = vllm.LLM(model=spec["model"], **spec.get("kwargs", {}))
    report: dict[str, Any] = {"ready_s": round(time.monotonic() - started, 3)}
    write_json(progress_path, report)
    request = spec["request"]
    params = vllm.SamplingParams(max_tokens=int(request["max_tokens"]), temperature=0.0)
    lora = None
    if request.get("lora"):
        lora_module: Any = importlib.import_module("vllm.lora.request")
        lora = lora_module.LoRARequest(request["lora"]["name"], 1, request["lora"]["path"])
    asked = time.monotonic()
    outputs = llm.generate([request["prompt"]], params, lora_request=lora)
    report["request_s"] = round(time.monotonic() - asked, 3)
    report["answered"] = bool(outputs) and isinstance(outputs[0].outputs[0].text, str)
    write_json(progress_path, report)
    return 0


def main(argv: list[str]) -> int:
    """Read the spec named on the command line and run it."""
    if len(argv) != 2:
        print("usage: offline.py SPEC_JSON_PATH PROGRESS_JSON_PATH", file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8") as handle:
        spec = json.load(handle)
    return run(spec, argv[1])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
