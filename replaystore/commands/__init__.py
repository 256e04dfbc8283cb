"""The ``replaystore`` command and the code only commands use, apart from the library.

``cli.py`` parses the command line (``replaystore``, ``python -m replaystore``)
and runs the operator commands; ``demo.py`` is ``replaystore demo``;
``ending.py`` is how every command ends, shared with the example MCP server
(``replaystore example-server``). Nothing of the library imports this
package, and this ``__init__`` imports none of its modules: running one
command loads no other.
"""
