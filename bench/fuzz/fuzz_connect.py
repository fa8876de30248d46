"""atheris target: the E2B Connect envelope (service/e2b/connect.py unenvelope). A JSON
object or RpcError with one of its codes; never another exception (a 500)."""

from _common import run

from corral.service.e2b.connect import RpcError, unenvelope


def one_input(data: bytes) -> None:
    for raw in (data, b"\x00" + len(data).to_bytes(4, "big") + data):
        try:
            d = unenvelope(raw)
        except RpcError as e:
            assert e.code in ("invalid_argument", "unimplemented", "resource_exhausted")
        else:
            assert isinstance(d, dict)


if __name__ == "__main__":
    run(one_input)
