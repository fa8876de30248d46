"""atheris target: the proxy's request-head parser (egress/conn.py). Any bytes, in any
pieces, give the same events as the whole, or ProxyProtocolError with a 400/403/431."""

from _common import Input, run

from corral.egress.conn import (
    NEED_DATA,
    PAUSED,
    Closed,
    ProxyConnection,
    ProxyProtocolError,
    RequestData,
)


def events(pieces):
    conn = ProxyConnection(4096)
    out = []
    try:
        for p in pieces:
            conn.receive_data(p)
            while True:
                ev = conn.next_event()
                if ev is NEED_DATA or ev is PAUSED:
                    break
                if isinstance(ev, RequestData):
                    if out and isinstance(out[-1], RequestData):
                        out[-1] = RequestData(out[-1].data + ev.data)
                    elif ev.data:
                        out.append(ev)
                else:
                    out.append(ev)
                if isinstance(ev, Closed):
                    return out, None
    except ProxyProtocolError as e:
        assert e.status in (400, 403, 431) and str(e).isprintable()
        return out, e.status
    return out, None


SEED = b"GET http://a.test/x HTTP/1.1\r\nHost: a.test\r\nContent-Length: 3\r\n\r\nabc"


def one_input(data: bytes) -> None:
    inp = Input(data)
    mode = inp.byte()
    body = inp.rest()
    if mode & 1:
        body = SEED[:mode % len(SEED)] + body
    if not body:
        return
    assert events(Input(data).cuts(body)) == events([body])


if __name__ == "__main__":
    run(one_input)
