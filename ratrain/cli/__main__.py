import sys

from ratrain.cli import main

if __name__ == "__main__":
    sys.exit(main())
