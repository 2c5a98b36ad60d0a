"""The worker's environment as virtualflow reads it: the names come from the C++ table
(runtime/job/worker_env.h) through virtualflow._core, never from a copy in Python."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from virtualflow import _core

PACKAGE = Path(__file__).resolve().parents[1] / "virtualflow"
NAME = re.compile(r"VF_[A-Z0-9_]+")


def test_every_name_of_the_table_is_exported_as_env_constant() -> None:
    names = {k: v for k, v in vars(_core).items() if k.startswith("ENV_")}
    assert len(names) >= 25
    for attribute, value in names.items():
        assert value == "VF_" + attribute.removeprefix("ENV_")
    for fact in ("VF_JOB_SPEC", "VF_COORDINATOR", "VF_WORKER", "VF_JOB_TOKEN_FILE"):
        assert fact in names.values()


def test_the_package_spells_no_variable_name_as_a_string_of_its_own() -> None:
    # A string that is exactly a VF_* name is a second definition of it; messages that mention
    # one are prose and may.
    for source in sorted(PACKAGE.glob("*.py")):
        tree = ast.parse(source.read_text(), str(source))
        own = [
            node.value
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and NAME.fullmatch(node.value)
        ]
        assert own == [], f"{source.name} names {own}: use virtualflow._core.ENV_*"
