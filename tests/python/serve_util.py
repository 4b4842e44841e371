"""Raw-socket helpers shared by the act-serve tests (the tests speak the wire protocol directly
to send what a well-behaved ActClient never would)."""
from act_client import wire


def recv_frame(s):
    """Read one whole frame from socket s: (message type, payload bytes)."""
    def exact(n):
        b = b""
        while len(b) < n:
            chunk = s.recv(n - len(b))
            if not chunk:
                raise ConnectionError("closed by server")
            b += chunk
        return b

    magic, version, mtype, length = wire.HDR.unpack(exact(wire.HDR.size))
    assert magic == wire.MAGIC and version == wire.VERSION
    return mtype, exact(length)
