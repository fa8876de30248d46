"""atheris target: the response scrubber (egress/secrets.py, forms.py). A value of
printable ASCII, put in the body in one of the claimed encodings, never survives; the
streamed answer, cut anywhere, is the whole answer."""

import base64
import html
import json
from urllib.parse import quote

from _common import Input, run

from corral.egress.secrets import ResponseScrubber

PLACEHOLDER = b"corral_TOKEN_0123456789abcdef0123456789abcdef"


def one_input(data: bytes) -> None:
    inp = Input(data)
    n = 8 + inp.byte() % 16
    value = bytes(0x21 + b % 94 for b in inp.take(n))
    if len(value) < 8 or value in PLACEHOLDER or PLACEHOLDER in value:
        return
    how = inp.byte() % 8
    text = value.decode()
    enc = [text, text.upper(), quote(text, safe=""), json.dumps(text)[1:-1],
           html.escape(text), value.hex(), base64.b64encode(value).decode(),
           base64.urlsafe_b64encode(b"x" + value).decode()][how].encode()
    around = inp.rest()
    cut = len(around) // 2
    body = around[:cut] + enc + around[cut:]
    s = ResponseScrubber({value: PLACEHOLDER})
    s.start([], has_body=True)
    out = b"".join(b"".join(s.feed(p)) for p in Input(data).cuts(body)) + s.end()
    assert out == ResponseScrubber({value: PLACEHOLDER}).scrub(body)
    assert enc not in out or enc in around, "an encoding of the value survived"


if __name__ == "__main__":
    run(one_input)
