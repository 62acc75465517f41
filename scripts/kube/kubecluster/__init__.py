"""The project's Kubernetes test cluster on this one machine (docs/test-cluster.md).

etcd and the control-plane components run in one network namespace, each node (a dockerd of its
own, a kubelet using the built-in dockershim, kube-proxy in iptables mode) in another; a bridge in
the control-plane namespace links them with the host, and routes carry pod traffic between the
nodes and from the host. Everything a cluster makes lives under its state directory, its cgroup
subtree and one host veth, all named after its slot (network namespaces are files of the state
directory, not /run/netns entries), so that `down`, and `up`, which first clears the leftovers of
a killed run, find and remove all of it, by pid.

Several clusters can exist at once in numbered slots (a test session takes the first free one);
slot S uses 10.(240+S).0.0/16 and names with acsk<S>. Standard library only: it runs with the
host's python3, outside the project's virtualenv, as root.
"""
