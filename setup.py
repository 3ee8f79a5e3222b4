"""Installs ``sglang_verify_graph_serve_help.pth`` next to the package (regular and editable
installs), the line that lets ``sglang serve --help`` list the plugin's flags
(``python/sglang_verify_graph/serve_help.py``). Everything else is in pyproject.toml."""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "sglang_verify_graph_serve_help.pth"


class build_py_with_pth(build_py):
    def run(self):
        super().run()
        # A wheel takes build_lib; an editable wheel is assembled from install_lib.
        target = (self.get_finalized_command("install").install_lib
                  if getattr(self, "editable_mode", False) else self.build_lib)
        self.copy_file(PTH, os.path.join(target, PTH))


setup(cmdclass={"build_py": build_py_with_pth})
