import sys

from ratrain.cli import main

sys.exit(main())
