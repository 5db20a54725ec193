import sys

from inferwise.server.cli import main

sys.exit(main())
