"""``python -m service.sql FD MEMORY_BYTES SCRATCH``: a sandbox worker process
(:mod:`service.sql.worker`); only :class:`service.sql.pool.WorkerPool` starts it."""

import sys

from service.sql.worker import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
