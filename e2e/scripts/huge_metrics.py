"""A rank for the chaos suite's oversized-scrape case: serves a 1 GiB
/metrics (announced, then streamed) on POD_IP:HT_METRICS_PORT for the given
number of seconds, then exits 0. It trains nothing."""

import http.server
import os
import sys
import threading
import time

SIZE = 1 << 30
CHUNK = b"#" + b"x" * 65534 + b"\n"


class Huge(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(SIZE))
        self.end_headers()
        sent = 0
        try:
            while sent < SIZE:
                self.wfile.write(CHUNK)
                sent += len(CHUNK)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def log_message(self, *args):
        pass


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 40.0
    addr = os.environ.get("POD_IP", "127.0.0.1")
    port = int(os.environ.get("HT_METRICS_PORT", "9400"))
    server = http.server.ThreadingHTTPServer((addr, port), Huge)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    time.sleep(seconds)


if __name__ == "__main__":
    main()
