#!/usr/bin/env bash
# End-to-end check of deploy/ on a kind cluster without kube-proxy:
#   1. creates a kind cluster (one control plane, one worker) with kubeProxyMode: none,
#   2. loads the agent's image (`cargo xtask image`, built first when missing) into the
#      nodes,
#   3. tells the agent the API server's address and applies deploy/sliceway-agent.yaml,
#   4. waits for the DaemonSet, deploys a two-replica Deployment and its Service,
#   5. checks that a client pod reaches the Service's ClusterIP (and only its pods),
#   6. deletes the cluster (unless --keep).
#
# Needs docker, kind and kubectl, and network access to pull the test images; building
# the image (`cargo xtask image`) needs root. It has not been run in the project's CI, which has no container
# engine.
#
# Usage: deploy/kind.sh [--keep] [--name CLUSTER]
set -euo pipefail

CLUSTER=sliceway
KEEP=0
IMAGE=sliceway-agent:dev
TEST_IMAGE=registry.k8s.io/e2e-test-images/agnhost:2.53
CLIENT_IMAGE=busybox:1.36

while [ $# -gt 0 ]; do
  case "$1" in
    --keep) KEEP=1 ;;
    --name) CLUSTER="$2"; shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

say() { printf 'kind.sh: %s\n' "$*" >&2; }
for tool in docker kind kubectl; do
  command -v "$tool" >/dev/null || { say "$tool is needed"; exit 1; }
done

cd "$(dirname "$0")/.."
CONTEXT="kind-$CLUSTER"
k() { kubectl --context "$CONTEXT" "$@"; }

cleanup() {
  if [ "$KEEP" -eq 1 ]; then
    say "keeping cluster $CLUSTER (kind delete cluster --name $CLUSTER removes it)"
  else
    say "deleting cluster $CLUSTER"
    kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
  fi
}

say "creating cluster $CLUSTER without kube-proxy"
kind create cluster --name "$CLUSTER" --wait 120s --config - <<'KIND'
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
networking:
  kubeProxyMode: none
nodes:
  - role: control-plane
  - role: worker
KIND
trap cleanup EXIT

ARCHIVE=target/images/sliceway-agent.tar
if [ ! -f "$ARCHIVE" ]; then
  say "building the images (cargo xtask image)"
  cargo xtask image
fi
say "loading $IMAGE from $ARCHIVE"
kind load image-archive "$ARCHIVE" --name "$CLUSTER"

# The agent runs in the node's network namespace, where no proxy serves the
# `kubernetes` ClusterIP: give it the control plane's address.
api_host=$(docker inspect -f '{{ (index .NetworkSettings.Networks "kind").IPAddress }}' "$CLUSTER-control-plane")
say "API server at $api_host:6443"
k -n kube-system create configmap sliceway-agent-apiserver \
  --from-literal=host="$api_host" --from-literal=port=6443 \
  --dry-run=client -o yaml | k apply -f -
k apply -f deploy/sliceway-agent.yaml
k -n kube-system rollout status daemonset/sliceway-agent --timeout=180s

say "deploying the test Service"
k create deployment web --image="$TEST_IMAGE" --replicas=2 -- /agnhost netexec --http-port=8080
k expose deployment web --port=80 --target-port=8080
k rollout status deployment/web --timeout=180s
k run client --image="$CLIENT_IMAGE" --restart=Never -- sleep 3600
k wait --for=condition=Ready pod/client --timeout=180s

vip=$(k get service web -o jsonpath='{.spec.clusterIP}')
pods=$(k get pods -l app=web -o jsonpath='{.items[*].metadata.name}')
say "ClusterIP $vip, backends: $pods"
seen=""
for i in $(seq 1 20); do
  # netexec's /hostname answers with the pod's name.
  name=$(k exec client -- wget -qO- -T 5 "http://$vip/hostname") || {
    say "request $i to $vip failed"
    k -n kube-system logs daemonset/sliceway-agent --tail=50 >&2 || true
    exit 1
  }
  case " $pods " in
    *" $name "*) ;;
    *) say "request $i answered by $name, which is not a backend of web"; exit 1 ;;
  esac
  case " $seen " in *" $name "*) ;; *) seen="$seen $name" ;; esac
done
say "20 requests to $vip answered by:$seen"
say "ok"
