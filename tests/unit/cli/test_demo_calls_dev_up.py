"""`llmq demo` calls `dev up` as a function: every parameter it does not pass needs a real default there, not a typer
Option object (an Option default reaches the stack as an object: `make demo` failed so once)."""

from __future__ import annotations

import ast
import inspect

from typer.models import OptionInfo

from llmq_cli import demo_cmd
from llmq_cli.dev import dev_up


def test_every_dev_up_parameter_the_demo_leaves_out_has_a_plain_default():
    tree = ast.parse(inspect.getsource(demo_cmd))
    (call,) = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "dev_up"]
    passed = {k.arg for k in call.keywords}
    left_out = {name: p.default for name, p in inspect.signature(dev_up).parameters.items() if name not in passed}
    assert left_out and not [n for n, d in left_out.items() if isinstance(d, OptionInfo)], left_out
