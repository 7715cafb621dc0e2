"""Tools run by `build.sh` and by hand, not collected by pytest: the fault-injection soak (`tools/chaos.py`) and
the protocol model checker (`tools/model.py`). They use the test infrastructure in `tests/support/`; nothing
there imports them."""
