"""atheris target: the ClientHello reader (egress/tls.py). Any bytes give NEED_MORE, a
ClientHello or TLSError; a prefix of input that parses never disagrees with the whole."""

from _common import Input, run

from corral.egress.tls import NEED_MORE, ClientHello, TLSError, parse_client_hello


def answer(data: bytes):
    try:
        r = parse_client_hello(data)
    except TLSError:
        return "error"
    assert r is NEED_MORE or isinstance(r, ClientHello)
    return r


def one_input(data: bytes) -> None:
    inp = Input(data)
    cut = inp.byte() * 256 + inp.byte()
    body = inp.rest()
    if inp.byte() & 1:       # as one record, so more inputs reach the handshake parser
        body = b"\x16\x03\x01" + len(body).to_bytes(2, "big") + body
    whole = answer(body)
    part = answer(body[:cut % (len(body) + 1)])
    if isinstance(whole, ClientHello):
        assert part is NEED_MORE or part == whole
    if isinstance(part, ClientHello):
        assert whole == part


if __name__ == "__main__":
    run(one_input)
