# moto's server answering one request at a time (see MotoServer::start_serial).
# Usage: python moto_serial.py HOST PORT
import os
import sys

from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.serving import run_simple

os.environ.setdefault("MOTO_PORT", sys.argv[2])
run_simple(
    sys.argv[1],
    int(sys.argv[2]),
    DomainDispatcherApplication(create_backend_app),
    threaded=False,
    request_handler=MotoRequestHandler,
)
