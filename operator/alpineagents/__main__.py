"""``python -m alpineagents``: the command line (see :mod:`alpineagents.cli`).

This is how a pod runs a run (the operator's pod command): once the command returned,
the process ends at once (:func:`~alpineagents.runner.run.end_process`), so that a runner
stopped by SIGTERM exits soon after its State is saved, even on a busy node.
"""

from .cli import main
from .runner.run import end_process

end_process(main())
