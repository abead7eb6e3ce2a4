"""The README's "From Python" example, run as written against the fake cluster (only its
endpoint list is swapped for the fake's): it prints ``done``, not ``b'done'``."""

import contextlib
import io
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def readme_python_example() -> str:
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    (block,) = [b for b in blocks if 'c.get("jobs/42/state")' in b]
    return block


def test_the_readme_python_example_prints_the_value_as_text(cluster):
    code = readme_python_example()
    endpoints = re.search(r"Client\((\[[^\]]*\])\)", code)
    assert endpoints, code
    code = code.replace(endpoints.group(1), repr(cluster.urls))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {})
    assert out.getvalue() == "done\n"
