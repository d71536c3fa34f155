// Package shadow compares what this controller would do with what the
// cluster shows, for a controller that runs beside kube-controller-manager's
// attach/detach controller and writes nothing (--shadow).
//
// In shadow mode the controller reads everything it normally reads and
// decides everything it normally decides, but its actual state is the
// cluster's: the VolumeAttachments and node.status.volumesAttached the
// built-in controller writes. Each {volume, node} is compared when its key is
// synced:
//
//   - our decision (reconciler.Decide on that state, plus "would we have
//     attached it at all" for a volume the cluster attached),
//   - against what the cluster shows (attached, attaching, detaching, or
//     nothing).
//
// A difference is a disagreement of one of four kinds: would-attach (a pod
// wants the volume, nothing attaches it, we would), would-detach (no pod
// wants it, it is safe to detach, the cluster keeps it), would-not-attach (the
// cluster attached a volume we would hold back, with our reason: an
// undecided mechanism, or a single-node volume another node holds) and
// would-wait-for-unmount (the cluster detaches a volume we would keep: still
// mounted, or our max wait for unmount has not passed). The built-in
// controller needs a few seconds to act, so a disagreement is opened only
// once it has lasted the grace period; the tracker asks for the key to be
// synced again when that period ends, and the key's next sync that agrees
// closes it. An opened disagreement is counted in a gauge and a counter by
// kind, logged when it opens and when it closes, and listed in the summary
// (/shadow): counts by kind, the oldest open ones, the last closed ones.
//
// Writing nothing is enforced where requests leave the process, not by
// checks in the code that acts: in shadow mode the controller's syncs never
// call a mechanism or the node status writer (they compare instead), its
// event recorder only logs, and its API client is wrapped by ReadOnly, which
// refuses any request but a read, logs it and counts it. Only leader
// election, with a client of its own, writes its Lease.
package shadow
