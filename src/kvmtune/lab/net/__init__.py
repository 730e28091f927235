"""The lab's guest networks: the topologies the seed-002 network benchmark (issue 7) and verify's guest tier use.

Everything lives in network namespaces named ``kvmtune-<run>-<role>`` with
addresses from 198.18.0.0/15; nothing is added to the root namespace.
:func:`make_topology` builds one (bridge, ovs, macvtap, nat, user) as a
context manager; :mod:`.standin` checks one end to end without guests;
:mod:`.cleanup` removes what a killed run left; :mod:`.netload` drives the netload binary.
"""

from kvmtune.lab.net.netns import ADDRESS_SPACE, PREFIX, NetError
from kvmtune.lab.net.topology import TOPOLOGIES, Endpoint, Topology, TopologySpec, make_topology

__all__ = ["ADDRESS_SPACE", "PREFIX", "TOPOLOGIES", "Endpoint", "NetError", "Topology", "TopologySpec", "make_topology"]
