"""Guest network topologies for the seed-002 network benchmark (issue 7).

Everything lives in network namespaces named ``kvmtune-<run>-<role>`` with
addresses from 198.18.0.0/15; nothing is added to the root namespace.
:func:`make_topology` builds one (bridge, ovs, macvtap, nat, user) as a
context manager; :mod:`.standin` checks one end to end without guests;
:mod:`.cleanup` removes what a killed run left.
"""

from kvmtune.bench.net.netns import ADDRESS_SPACE, PREFIX, NetError
from kvmtune.bench.net.topology import TOPOLOGIES, Endpoint, Topology, TopologySpec, make_topology

__all__ = ["ADDRESS_SPACE", "PREFIX", "TOPOLOGIES", "Endpoint", "NetError", "Topology", "TopologySpec", "make_topology"]
