"""atheris target: the audit spool's line parser (audit/spool.py), ingested into a real
SQLite store. Every line is a run or a skipped line; the ingest never fails."""

import os
import shutil
import tempfile

from _common import run

from corral.audit import spool, store

TOP = tempfile.mkdtemp(prefix="corral-atheris-spool-")
GOOD = (b'{"id":"r","kind":"run","sandbox":null,"started":1,"ended":2,"tier":"namespace",'
        b'"image":"host","image_digest":"","policy_digest":"","policy":"","argv":["true"],'
        b'"verdict":"ok","exit_code":0,"signal":null,"usage":{},"actor":"a","face":"cli",'
        b'"events":[]}\n')


def one_input(data: bytes) -> None:
    shutil.rmtree(TOP)
    os.makedirs(os.path.join(TOP, "spool"), mode=0o700)
    with open(os.path.join(TOP, "spool", spool.SPOOL_NAME), "wb") as f:
        f.write(GOOD + data + b"\n" + GOOD.replace(b'"r"', b'"s"'))
    conn = store.connect(os.path.join(TOP, "audit.db"), spool=False)
    try:
        got = spool.ingest(conn, TOP)
        assert got["runs"] >= 2, got          # the good lines around the input are kept
    finally:
        conn.close()


if __name__ == "__main__":
    run(one_input)
