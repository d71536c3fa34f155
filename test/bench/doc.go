// Package bench measures the attach/detach controller side by side with
// kube-controller-manager's attachdetach controller, on one real etcd and
// kube-apiserver, in one run.
//
// Each controller gets, in turn, a fresh namespace and node set (the previous
// controller's objects are deleted before it starts, so neither caches the
// other's), the same --kube-api-qps / --kube-api-burst, and its own service
// account, so that the apiserver's audit log (Metadata level, for those two
// users only) counts every API request each controller makes the same way:
// kube-controller-manager runs with --secure-port=0 and serves no metrics.
// A test external-attacher inside the harness, with an unthrottled client,
// marks VolumeAttachments attached (finalizer, then status) and lets deleted
// ones go (finalizer removed); no kubelet runs, so nothing is in
// node.status.volumesInUse (but the move phase's moved volumes, which the
// harness writes there as their kubelet would) and every other detach is
// safe at once.
//
// Phases, each bounded in time:
//
//   - burst: N nodes x M pods, each pod with its own bound ReadWriteOnce CSI
//     PV, created at once; until every VolumeAttachment exists, and until
//     every node.status.volumesAttached lists exactly its volumes.
//   - idle: everything attached, nothing changes; CPU time (utime+stime from
//     /proc/PID/stat) and memory (VmRSS, VmHWM from /proc/PID/status).
//   - restart: everything attached and reported, the controller is stopped
//     (SIGTERM) and started again; right after, one more volume and a pod
//     using it are created. Until it is ready (ours: /readyz; KCM, which
//     serves nothing: its "Caches are synced" log line), until that volume
//     is attached and in node status, and the requests starting cost (those
//     on the new volume's objects counted apart): none of them need be a
//     write.
//   - churn: per round, one pod per node (1/M of the pods) is deleted and
//     replaced by a pod using the same claim on the next node, as a
//     rescheduled StatefulSet pod: the old attachment must be detached
//     before the new one (ReadWriteOnce) can be attached.
//   - move: a few volumes, each mounted on its node (in its
//     status.volumesInUse), move to the next node as a StatefulSet moves
//     a pod (old pod deleted, the harness drops the volume from
//     volumesInUse as its kubelet would on unmount, new pod created),
//     right after a burst of new pods with volumes of their own is
//     created; every attach of the phase takes the attacher's delay. Per
//     moved volume, from its unmount until its new node's
//     status.volumesAttached lists it: the target is 2 s plus that delay,
//     however many pods arrived before. The burst's pods are then deleted.
//   - stream: a set of volumes spread over the nodes is torn down (their
//     pods deleted at once) twice: alone, then while new pods arrive at a
//     steady rate. Each from the first deletion until every
//     VolumeAttachment of the set is gone: under the stream, whose
//     attaches the controller serves first, at most 1.2 times as long as
//     alone. The stream's pods are then deleted.
//   - teardown: every pod deleted; right after, one more pod, with a volume
//     of its own, on the canary node. Until every other VolumeAttachment is
//     gone and every node's status lists nothing but the new volume, and,
//     from the new pod's creation, until its volume is attached and in node
//     status: a pod's wait while every other volume detaches (queued behind
//     the detaches, it would wait about as long as the teardown).
//
// The floor of a phase is the time the API budget alone imposes: a client
// limited to QPS requests per second with a burst of B sends W requests in
// at least (W - B) / QPS seconds. W counts only the writes the phase cannot
// do without (see floors.go).
package bench
