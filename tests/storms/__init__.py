# The fleet nemesis (docs/nemesis.md): Jepsen's shape for three `hunter serve` daemons on one
# PostgreSQL. One module per piece, each usable on its own:
#   cluster    the private PostgreSQL, also on TCP (built on tests/supervisor/store/pg_cluster)
#   proxy      a TCP proxy per daemon that can delay, black-hole and cut its database traffic
#   fleet      the three daemons with their no-op executors, stopped, killed and restarted
#   history    the JSON-lines record of every call and fault
#   generator  the load: keyed mixed turns, round-robin, every call recorded
#   starvation busy loops and a CPU quota
#   nemesis    the seeded fault schedule and the faults
#   checker    the verdict over the history and the end state (pure functions)
#   run        one run, start to verdict, everything cleaned up
# It may import the product (supervisor, sandbox, ledger) and the tests' helpers; nothing in the
# product imports it.
from tests.storms.checker import Check as Check
from tests.storms.checker import Verdict as Verdict
from tests.storms.nemesis import FAULT_KINDS as FAULT_KINDS
from tests.storms.nemesis import Fault as Fault
from tests.storms.nemesis import schedule as schedule
from tests.storms.run import NemesisConfig as NemesisConfig
from tests.storms.run import run_nemesis as run_nemesis

__all__ = ["FAULT_KINDS", "Check", "Fault", "NemesisConfig", "Verdict", "run_nemesis", "schedule"]
