import sys

from sglang_verify_graph.advisor.cli import main

sys.exit(main())
