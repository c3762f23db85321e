"""A git:// 'host' that answers every request with an ERR packet holding invalid UTF-8."""

import socket
import threading


def serve(payload: bytes = b"ERR no such repo \xff\xfe\n"):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)

    def loop():
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            try:
                c.recv(4096)
                c.sendall(b"%04x" % (len(payload) + 4) + payload)
            finally:
                c.close()

    threading.Thread(target=loop, daemon=True).start()
    return srv, f"git://127.0.0.1:{srv.getsockname()[1]}/fleet.git"
