"""Stand-in for the managed Python runtime's /var/runtime/bootstrap.py, on awslambdaric.

It builds the search path Lambda documents for its Python runtimes -- the task root, then the layers'
`python/lib/pythonX.Y/site-packages` and `python/` -- in front of the runtime's own packages (here the
runtime venv's site-packages, holding awslambdaric and boto3), and hands `_HANDLER` to awslambdaric.
`LAMBDA_OPT_DIR` stands in for /opt. PYTHONPATH is neither read nor set here: the wrapper contract says a
wrapper may not rely on it.
"""

from __future__ import annotations

import os
import sys


def _search_path() -> list[str]:
    opt = os.environ.get("LAMBDA_OPT_DIR", "/opt")
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    return [
        os.environ.get("LAMBDA_TASK_ROOT", "/var/task"),
        os.path.join(opt, "python", "lib", version, "site-packages"),
        os.path.join(opt, "python"),
    ]


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    # Python put this file's folder first; the handler must not import from the test support tree.
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    sys.path[0:0] = _search_path()
    os.chdir(os.environ.get("LAMBDA_TASK_ROOT", "/var/task"))  # Lambda runs the function in its task root

    from awslambdaric import __main__ as ric

    ric.main([sys.argv[0], os.environ["_HANDLER"]])


if __name__ == "__main__":
    main()
