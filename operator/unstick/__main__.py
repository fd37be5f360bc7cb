import sys

from unstick.cli import main

sys.exit(main())
