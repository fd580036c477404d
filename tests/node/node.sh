#!/usr/bin/env bash
# A real single-node Kubernetes cluster for drafs's real-node test tier, run
# inside network, mount and PID namespaces that the test creates:
#
#   unshare --net --mount --pid --fork --kill-child --mount-proc \
#       bash tests/node/node.sh WORK BIN IMAGES ID
#
# BIN holds the programs tests/go/build.sh built.
#
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, containerd
# (runc from Debian), the kubelet and two instances of the DRA driver (one
# writing KEP-5304 device metadata, one not). Every address lives on this
# namespace's own `lo`: 127.0.0.1, the node IP and the `kubernetes` Service IP
# (the API server listens on all of them, the way kube-proxy would make the
# Service IP work); pods get addresses on a bridge made here. tmpfs over /run,
# /var/lib, /var/log and /etc/cni keeps the kubelet's and containerd's fixed
# paths off the host.
#
# WORK/ready appears when the node is Ready and both drivers' ResourceSlices are
# published; WORK/failed holds the reason when it cannot start. The cluster runs
# until standard input closes (or SIGTERM), then everything in the namespaces is
# killed, the pod cgroups runc made on the host's cgroup hierarchies are
# removed and the sysctls the kubelet changed are restored. A hard kill of the
# test leaves only those two; tests/support/node.rs sweeps them at the next
# start (WORK/cgroup-root and WORK/sysctl.orig say what to undo).
set -uo pipefail
work=$1 bin=$2 images=$3 id=$4
readonly NODE_NAME=drafs-node NODE_IP=10.201.0.2 SERVICE_IP=10.96.0.1 POD_CIDR=10.202.0.0/24
readonly GATES="DRAListTypeAttributes=true,DRAConsumableCapacity=true"
readonly CGROUP_ROOT="drafs-node-$id"
readonly SYSCTLS="vm.overcommit_memory kernel.panic kernel.panic_on_oops"
export PATH="$bin:/usr/sbin:/usr/bin:/sbin:/bin"
log=$work/logs
mkdir -p "$log"

fail() {
    echo "$*" >"$work/failed"
    echo "node.sh: $*" >&2
    exit 1
}

cgroup_dirs() { # every hierarchy's copy of the cgroup root
    for h in /sys/fs/cgroup/*/ /sys/fs/cgroup/; do
        [ -d "$h$CGROUP_ROOT" ] && echo "$h$CGROUP_ROOT"
    done
}

others_alive() { # any process of the namespace but this one (zombies left out)
    local p state
    for p in /proc/[0-9]*; do
        p=${p#/proc/}
        [ "$p" = 1 ] || [ "$p" = "$BASHPID" ] && continue
        read -r _ _ state _ <"/proc/$p/stat" 2>/dev/null || continue
        [ "$state" = Z ] || return 0
    done
    return 1
}

teardown() {
    trap - EXIT TERM INT
    # PID 1 of the namespace: kill -1 reaches every other process in it.
    kill -TERM -1 2>/dev/null
    for _ in $(seq 50); do
        others_alive || break
        sleep 0.1
    done
    kill -KILL -1 2>/dev/null
    for _ in $(seq 100); do
        others_alive || break
        sleep 0.1
    done
    # Empty now: remove the cgroups, deepest first (a cgroup is removed with rmdir).
    for d in $(cgroup_dirs) $(ls -d /sys/fs/cgroup/unified/kubepods* 2>/dev/null); do
        find "$d" -depth -type d -exec rmdir {} + 2>/dev/null
    done
    if [ -f "$work/sysctl.orig" ]; then
        while read -r name value; do
            sysctl -qw "$name=$value" >/dev/null 2>&1
        done <"$work/sysctl.orig"
    fi
    rm -f "$work/ready"
    echo "node.sh: stopped" >&2
}
trap teardown EXIT
trap 'exit 0' TERM INT

# --- namespaces: addresses and private paths -----------------------------------------------
ip link set lo up || fail "cannot bring lo up"
ip addr add "$NODE_IP/32" dev lo || fail "cannot add the node IP"
ip addr add "$SERVICE_IP/32" dev lo || fail "cannot add the Service IP"
for d in /run /var/lib /var/log /etc/cni; do
    mkdir -p "$d" && mount -t tmpfs -o mode=0755 tmpfs "$d" || fail "cannot mount tmpfs on $d"
done
mkdir -p /var/lib/kubelet /run/cdi /etc/cni/net.d /run/containerd
# Bidirectional mount propagation (the FUSE sidecar, the CSI agent's pods, the NRI
# agent's trees under /run/drafs) needs shared mounts, as on a systemd host.
mount --bind /var/lib/kubelet /var/lib/kubelet && mount --make-rshared /var/lib/kubelet || fail "cannot share /var/lib/kubelet"
mount --make-rshared /run || fail "cannot share /run"

# --- cgroups: the kubelet's root in every v1 hierarchy, cpusets copied -----------------------
for h in /sys/fs/cgroup/*/; do
    case "$h" in */unified/ | */systemd/) continue ;; esac
    [ -e "$h/cgroup.procs" ] || continue
    mkdir -p "$h$CGROUP_ROOT" || fail "cannot make cgroup $h$CGROUP_ROOT"
    if [ -e "$h/cpuset.cpus" ]; then
        cat "$h/cpuset.cpus" >"$h$CGROUP_ROOT/cpuset.cpus"
        cat "$h/cpuset.mems" >"$h$CGROUP_ROOT/cpuset.mems"
    fi
done
[ -d /sys/fs/cgroup/systemd ] && mkdir -p "/sys/fs/cgroup/systemd/$CGROUP_ROOT"
[ -e /sys/fs/cgroup/cgroup.controllers ] && mkdir -p "/sys/fs/cgroup/$CGROUP_ROOT"
echo "$CGROUP_ROOT" >"$work/cgroup-root"
for s in $SYSCTLS; do echo "$s $(sysctl -n "$s")"; done >"$work/sysctl.orig"

# --- certificates (openssl, as an operator would) -------------------------------------------
pki=$work/pki
mkdir -p "$pki"
cd "$pki" || fail "no $pki"
ossl() { openssl "$@" >/dev/null 2>&1 || fail "openssl $*"; }
ossl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj /CN=drafs-node-ca \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign -keyout ca.key -out ca.crt
cert() { # name subject extendedKeyUsage [san]
    ossl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "$2" -keyout "$1.key" -out "$1.csr"
    { echo "basicConstraints=critical,CA:FALSE"; echo "keyUsage=critical,digitalSignature"; echo "extendedKeyUsage=$3"
      [ -n "${4:-}" ] && echo "subjectAltName=$4"; } >"$1.ext"
    ossl x509 -req -days 2 -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -extfile "$1.ext" -out "$1.crt"
}
cert apiserver /CN=kube-apiserver serverAuth \
    "IP:127.0.0.1,IP:$NODE_IP,IP:$SERVICE_IP,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
cert kubelet-client "/O=system:nodes/CN=system:node:$NODE_NAME" clientAuth
cert kubelet-serving "/CN=$NODE_NAME" serverAuth "IP:$NODE_IP,DNS:$NODE_NAME"
cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" clientAuth
cert admin "/O=system:masters/CN=drafs-node-admin" clientAuth
ossl ecparam -name prime256v1 -genkey -noout -out sa.key
kubeconfig() { # file user-cert server
    cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: node
  cluster: {server: "$3", certificate-authority: $pki/ca.crt}
users:
- name: user
  user: {client-certificate: $pki/$2.crt, client-key: $pki/$2.key}
contexts:
- name: node
  context: {cluster: node, user: user, namespace: default}
current-context: node
EOF
}
kubeconfig "$work/admin.kubeconfig" admin https://127.0.0.1:443
kubeconfig "$work/kubelet.kubeconfig" kubelet-client "https://$NODE_IP:443"
kubectl() { command kubectl --kubeconfig "$work/admin.kubeconfig" "$@"; }

start() { # name command...
    local name=$1
    shift
    "$@" </dev/null >>"$log/$name.log" 2>&1 &
    echo "$!" >"$work/$name.pid"
}
alive() { kill -0 "$(cat "$work/$1.pid")" 2>/dev/null || fail "$1 exited: $(tail -n 20 "$log/$1.log")"; }
wait_for() { # seconds what command...
    local limit=$1 what=$2
    shift 2
    local end=$((SECONDS + limit))
    until "$@" >/dev/null 2>&1; do
        [ $SECONDS -lt $end ] || fail "$what not ready after ${limit}s"
        sleep 0.2
    done
}

# --- control plane ---------------------------------------------------------------------------
start etcd etcd --name node --data-dir /var/lib/etcd --unsafe-no-fsync --log-level warn \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster node=http://127.0.0.1:2380
start kube-apiserver kube-apiserver --etcd-servers=http://127.0.0.1:2379 \
    --bind-address=0.0.0.0 --secure-port=443 --advertise-address=$NODE_IP \
    --cert-dir="$pki/apiserver-certs" --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
    --client-ca-file="$pki/ca.crt" --kubelet-client-certificate="$pki/apiserver-kubelet-client.crt" \
    --kubelet-client-key="$pki/apiserver-kubelet-client.key" \
    --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction --kubelet-preferred-address-types=InternalIP \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$pki/sa.key" --service-account-signing-key-file="$pki/sa.key" \
    --api-audiences=https://kubernetes.default.svc.cluster.local \
    --service-cluster-ip-range=10.96.0.0/16 --feature-gates=$GATES --allow-privileged=true --profiling=false --v=1
wait_for 120 kube-apiserver kubectl get --raw /readyz
alive kube-apiserver
start kube-controller-manager kube-controller-manager --kubeconfig="$work/admin.kubeconfig" \
    --authentication-kubeconfig="$work/admin.kubeconfig" --authorization-kubeconfig="$work/admin.kubeconfig" \
    --leader-elect=false --controllers='*' --root-ca-file="$pki/ca.crt" \
    --service-account-private-key-file="$pki/sa.key" --feature-gates=$GATES --bind-address=127.0.0.1 --v=1
start kube-scheduler kube-scheduler --kubeconfig="$work/admin.kubeconfig" \
    --authentication-kubeconfig="$work/admin.kubeconfig" --authorization-kubeconfig="$work/admin.kubeconfig" \
    --leader-elect=false --feature-gates=$GATES --bind-address=127.0.0.1 --v=1

# --- container runtime -----------------------------------------------------------------------
cat >"$work/containerd.toml" <<EOF
version = 3
root = "/var/lib/containerd"
state = "/run/containerd"
[grpc]
  address = "/run/containerd/containerd.sock"
# NRI is on by default; its default validator too here (no plugin required
# node-wide), so that a pod can ask for a plugin it cannot start without
# (annotation required-plugins.noderesource.dev: the real-node NRI tests).
[plugins."io.containerd.nri.v1.nri".default_validator]
  enable = true
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "registry.k8s.io/pause:drafs"
[plugins."io.containerd.cri.v1.runtime"]
  # No CAP_SYS_RESOURCE on this machine kind: runc must not raise oom_score_adj.
  restrict_oom_score_adj = true
  # The DRA library writes KEP-5304 metadata specs to /var/run/cdi whatever --cdi-dir says.
  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "/etc/cni/net.d"
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "$(command -v runc)"
        SystemdCgroup = false
EOF
cat >/etc/cni/net.d/10-drafs.conflist <<EOF
{"cniVersion": "1.0.0", "name": "drafs-node", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "loopback"}]}
EOF
start containerd containerd --config "$work/containerd.toml"
wait_for 60 containerd ctr --address /run/containerd/containerd.sock version
for image in "$images"/*.tar; do
    ctr --address /run/containerd/containerd.sock -n k8s.io images import --local "$image" >>"$log/images.log" 2>&1 ||
        ctr --address /run/containerd/containerd.sock -n k8s.io images import "$image" >>"$log/images.log" 2>&1 ||
        fail "cannot import $image: $(tail -n 5 "$log/images.log")"
done

# --- kubelet ---------------------------------------------------------------------------------
cat >"$work/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# Only the API server (a client certificate of this CA) talks to the kubelet,
# inside this namespace.
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $pki/ca.crt}
authorization: {mode: AlwaysAllow}
tlsCertFile: $pki/kubelet-serving.crt
tlsPrivateKeyFile: $pki/kubelet-serving.key
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
cgroupDriver: cgroupfs
cgroupRoot: /$CGROUP_ROOT
failCgroupV1: false
failSwapOn: false
readOnlyPort: 0
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "1Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
resolvConf: /etc/resolv.conf
featureGates: {DRAListTypeAttributes: true, DRAConsumableCapacity: true}
EOF
kubelet_command=(kubelet --config="$work/kubelet.yaml" --kubeconfig="$work/kubelet.kubeconfig"
    --hostname-override=$NODE_NAME --node-ip=$NODE_IP --root-dir=/var/lib/kubelet --v=1)
start kubelet "${kubelet_command[@]}"
node_ready() {
    [ "$(kubectl get node $NODE_NAME -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}')" = True ]
}
wait_for 120 "the node" node_ready
alive kubelet
kubelet_serving() {
    (exec 3<>/dev/tcp/127.0.0.1/10248 && printf 'GET /healthz HTTP/1.0\r\n\r\n' >&3 && grep -qx 'ok' <&3) &&
        (exec 3<>/dev/tcp/$NODE_IP/10250)
}

# --- DRA drivers -----------------------------------------------------------------------------
# One driver a line: its name, a colon, its flags (a word list).
while IFS= read -r driver <&3; do
    name=${driver%%:*} flags=${driver#*:}
    # shellcheck disable=SC2086 # flags is a word list
    start "driver-$name" dra-driver --kubeconfig="$work/admin.kubeconfig" --node-name=$NODE_NAME \
        --driver-name="$name" --datadir=/var/lib/kubelet/plugins \
        --plugin-registration-path=/var/lib/kubelet/plugins_registry --cdi-dir=/var/run/cdi \
        --devices="$work/devices-$name.json" --health="$work/health-$name.json" $flags
done 3<"$work/drivers"
while IFS= read -r driver <&3; do
    name=${driver%%:*}
    slice_for() { [ -n "$(kubectl get resourceslices --field-selector spec.driver="$1" -o name)" ]; }
    wait_for 60 "driver $name's ResourceSlice" slice_for "$name"
    alive "driver-$name"
done 3<"$work/drivers"
# Pods need their namespace's default ServiceAccount and kube-root-ca.crt.
wait_for 60 "the default ServiceAccount" kubectl get serviceaccount default
wait_for 60 "kube-root-ca.crt" kubectl get configmap kube-root-ca.crt

touch "$work/ready"
echo "node.sh: ready" >&2
# A test asks for a kubelet restart (the pods and their volumes stay, as on
# a real node): stopped, started again, and counted in kubelet-restarts.
restart_kubelet() {
    local pid
    pid=$(cat "$work/kubelet.pid")
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 100); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null
    start kubelet "${kubelet_command[@]}"
    # The node stays Ready for a while after its kubelet stopped: wait for
    # the new kubelet's own health and its API port instead.
    wait_for 120 "the restarted kubelet" kubelet_serving
    wait_for 120 "the restarted kubelet's node" node_ready
    alive kubelet
    echo restarted >>"$work/kubelet-restarts"
}

# Run until standard input closes; wake every second so a signal is handled.
while :; do
    line=
    read -r -t 1 line
    status=$?
    [ $status -gt 128 ] || [ $status -eq 0 ] || break
    [ "$line" = restart-kubelet ] && restart_kubelet
done
exit 0
