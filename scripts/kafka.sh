#!/usr/bin/env bash
# A real Apache Kafka cluster on this machine for tests, the soak and contributors: KRaft nodes that are
# each broker and controller, each its own JVM on loopback, so one can be SIGKILLed, SIGSTOPped or
# restarted on its data while the others serve (docs/testing.md, "A real Kafka cluster").
#
#   scripts/kafka.sh fetch          the pinned jars into .deps/kafka-VERSION/libs, checked (make kafka)
#   scripts/kafka.sh libs           prints that folder; exit 2 when it is not fetched
#   scripts/kafka.sh up [N]         formats and starts N nodes (default 3), waits until every node's
#                                   metadata lists all N brokers, prints bootstrap=HOST:PORT,... last
#   scripts/kafka.sh kill I         SIGKILL node I (1-based)
#   scripts/kafka.sh stop I         SIGTERM node I, then waits for it to exit (SIGKILL at the deadline)
#   scripts/kafka.sh start I        restarts node I on its data and ports; waits until it serves
#                                   metadata listing itself (KAFKA_NO_WAIT=1: only starts it)
#   scripts/kafka.sh pause I        SIGSTOP node I;  resume I: SIGCONT
#   scripts/kafka.sh pid I          prints node I's pid, exit 1 when it is not running
#   scripts/kafka.sh status         one line per node: running, paused or down
#   scripts/kafka.sh bootstrap      prints bootstrap=... again
#   scripts/kafka.sh down           ends every node (SIGTERM, SIGKILL at the deadline) and says how
#
# KAFKA_CLUSTER_DIR   the folder of one cluster: configs, data, logs (node-I/server.log), pids
#                     (default .deps/kafka-cluster); several clusters run at once in several folders
# KAFKA_VERSION       a pinned version: one with deploy/kafka/VERSION.sha256 (default 4.4.0)
# KAFKA_PORT_BASE     node I listens on BASE+2(I-1) (clients) and the next port (controller);
#                     unset: free ports are drawn below the ephemeral range
# KAFKA_BROKER_CONFIG extra broker properties, k=v separated by newlines or commas
#                     (default.replication.factor=3,min.insync.replicas=2); they win over ours
# KAFKA_HEAP          JVM heap flags (default -Xms128m -Xmx384m)
# KAFKA_WAIT_S        deadline of up and start, seconds (default 120); KAFKA_STOP_S: of stop and
#                     down before SIGKILL (default 30)
#
# kcat (PATH, or .deps/kcat/bin from `make kcat`) reads the metadata the waits check.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
pins_dir=$root/deploy/kafka
version=${KAFKA_VERSION:-4.4.0}
home=$root/.deps/kafka-$version
libs=$home/libs
dir=${KAFKA_CLUSTER_DIR:-$root/.deps/kafka-cluster}
wait_s=${KAFKA_WAIT_S:-120}
stop_s=${KAFKA_STOP_S:-30}
export PATH=$root/.deps/kcat/bin:$PATH

die() {
	echo "kafka.sh: $*" >&2
	exit 1
}

# fetch resolves the POM's jars for $version into a fresh folder beside the final one, checks every
# file against the committed list (no file missing, none extra, every hash equal) and only then moves
# it into place, so .deps never holds a partial or unchecked set. The Maven repository is .deps/m2:
# a clean machine downloads once.
fetch() {
	local pins=$pins_dir/$version.sha256
	[[ -f $pins ]] || die "Kafka $version is not pinned: deploy/kafka/$version.sha256 does not exist (pinned: $(cd "$pins_dir" && ls ./*.sha256 | sed 's|^\./||; s|\.sha256$||' | tr '\n' ' '))"
	if [[ -f $home/pins.sha256 ]] && cmp -s "$pins" "$home/pins.sha256"; then
		touch "$home/pins.sha256" # the same list is the same jars: make's stamp is current again
		return 0
	fi
	command -v mvn >/dev/null || die "mvn is not installed (Debian: apt-get install maven)"
	local tmp=$home.tmp
	rm -rf "$tmp"
	"$root/scripts/retry.sh" 3 mvn -q -B -Dstyle.color=never -f "$pins_dir/pom.xml" -Dmaven.repo.local="$root/.deps/m2" \
		-Dkafka.version="$version" dependency:copy-dependencies -DincludeScope=runtime \
		-DoutputDirectory="$tmp/libs" >&2 || die "mvn could not resolve kafka_2.13 $version"
	local want got
	want=$(awk '{ print $2 }' "$pins" | sort)
	got=$(cd "$tmp/libs" && ls | sort)
	if [[ $want != "$got" ]]; then
		diff <(echo "$want") <(echo "$got") >&2 || true
		die "the jars Maven resolved for $version are not the pinned list (< pinned, > resolved); $tmp kept"
	fi
	(cd "$tmp/libs" && sha256sum -c --quiet "$pins" >&2) || die "a jar of $version does not match its SHA-256 in $pins; $tmp kept"
	cp "$pins" "$tmp/pins.sha256"
	rm -rf "$home"
	mv "$tmp" "$home"
	echo "kafka.sh: Kafka $version: $(wc -l <"$pins") jars, $(du -sh "$libs" | cut -f1), checked" >&2
}

need_libs() {
	[[ -f $home/pins.sha256 ]] || die "Kafka $version's jars are not fetched: run make kafka (or KAFKA_VERSION=$version scripts/kafka.sh fetch)"
	command -v kcat >/dev/null || die "kcat is not installed: run make kcat"
}

# cluster.env is the cluster's own record (node count, ports, version): every later command reads it,
# so kill/start/down never depend on the caller's environment matching up's.
load() {
	[[ -f $dir/cluster.env ]] || die "no cluster in $dir (scripts/kafka.sh up first)"
	# shellcheck disable=SC1091
	source "$dir/cluster.env"
	home=$root/.deps/kafka-$version
	libs=$home/libs
}

node_arg() {
	local i=${1:-}
	[[ $i =~ ^[0-9]+$ ]] && ((i >= 1 && i <= nodes)) || die "node must be 1..$nodes, not '${1:-}'"
}

port_of() { echo $((ports[$1 - 1])); }
cport_of() { echo $((ports[$1 - 1] + 1)); }

# alive: the pid in node I's file is a live (not zombie) process running that node's config. The
# command line check makes a recycled pid harmless: no signal ever reaches another process.
pid_of() {
	local f=$dir/node-$1/pid pid state
	[[ -f $f ]] || return 1
	pid=$(<"$f")
	[[ -r /proc/$pid/cmdline ]] || return 1
	state=$(awk '{ print $3 }' "/proc/$pid/stat" 2>/dev/null) || return 1
	[[ $state != Z ]] || return 1
	tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$dir/node-$1/server.properties" || return 1
	echo "$pid"
}

bootstrap_list() {
	local i out=
	for ((i = 1; i <= nodes; i++)); do out+=${out:+,}127.0.0.1:$(port_of "$i"); done
	echo "$out"
}

# port_free: nothing listens on 127.0.0.1:P (a refused connection).
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

pick_ports() {
	local n=$1 base try i ok
	if [[ -n ${KAFKA_PORT_BASE:-} ]]; then
		base=$KAFKA_PORT_BASE
		for ((i = 0; i < 2 * n; i++)); do
			port_free $((base + i)) || die "port $((base + i)) (KAFKA_PORT_BASE=$base) is in use"
		done
	else
		# Below the ephemeral range (32768+), so no client's outgoing connection holds one of them.
		for ((try = 0; try < 50; try++)); do
			base=$((15000 + (RANDOM % 800) * 20))
			ok=1
			for ((i = 0; i < 2 * n; i++)); do port_free $((base + i)) || { ok=0 && break; }; done
			((ok)) && break
		done
		((ok)) || die "found no $((2 * n)) free ports in 50 draws"
	fi
	ports=()
	for ((i = 0; i < n; i++)); do ports+=($((base + 2 * i))); done
}

write_config() {
	local i=$1 n=$nodes voters= j rf=$((nodes < 3 ? nodes : 3)) isr
	isr=$((rf < 2 ? 1 : 2))
	for ((j = 1; j <= n; j++)); do voters+=${voters:+,}$j@127.0.0.1:$(cport_of "$j"); done
	mkdir -p "$dir/node-$i/data"
	{
		cat <<-EOF
			# Written by scripts/kafka.sh up; KAFKA_BROKER_CONFIG's lines follow ours and win.
			process.roles=broker,controller
			node.id=$i
			controller.quorum.voters=$voters
			listeners=PLAINTEXT://127.0.0.1:$(port_of "$i"),CONTROLLER://127.0.0.1:$(cport_of "$i")
			advertised.listeners=PLAINTEXT://127.0.0.1:$(port_of "$i")
			listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
			controller.listener.names=CONTROLLER
			inter.broker.listener.name=PLAINTEXT
			log.dirs=$dir/node-$i/data
			# Test defaults: internal topics as replicated as the cluster allows, no rebalance delay,
			# and threads for a small machine shared by several clusters.
			offsets.topic.replication.factor=$rf
			transaction.state.log.replication.factor=$rf
			transaction.state.log.min.isr=$isr
			share.coordinator.state.topic.replication.factor=$rf
			share.coordinator.state.topic.min.isr=$isr
			group.initial.rebalance.delay.ms=0
			num.network.threads=2
			num.io.threads=2
			background.threads=2
			num.recovery.threads.per.data.dir=1
			log.cleaner.threads=1
			log.cleaner.dedupe.buffer.size=33554432
		EOF
		tr ',' '\n' <<<"${KAFKA_BROKER_CONFIG:-}" | sed 's/^[[:space:]]*//; s/[[:space:]]*$//' | grep -v '^$' || true
	} >"$dir/node-$i/server.properties"
}

# java_cmd I: the JVM's command line for node I, in the array jcmd.
java_cmd() {
	local i=$1 heap
	read -r -a heap <<<"${KAFKA_HEAP:--Xms128m -Xmx384m}"
	# SerialGC and C1 only: a broker here serves a test's few MiB, and a JVM that starts in half the
	# time and holds no GC threads matters more than peak throughput (docs/testing.md has the figures).
	jcmd=(java "${heap[@]}" -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -XX:-UsePerfData
		-Xss512k -Djava.awt.headless=true "-Dkafka.logs.dir=$dir/node-$i"
		"-Dlog4j2.configurationFile=$pins_dir/log4j2.properties" -cp "$libs/*")
}

launch() {
	local i=$1
	# nohup and setsid exec in turn, so $! is the JVM's pid; its own session keeps a Ctrl-C or a test's
	# process group signal away from it: only this script signals a node.
	java_cmd "$i"
	nohup setsid "${jcmd[@]}" kafka.Kafka "$dir/node-$i/server.properties" \
		>>"$dir/node-$i/stdout.log" 2>&1 </dev/null &
	echo $! >"$dir/node-$i/pid"
}

# brokers_seen I: the broker ids node I's own metadata lists, one per line (empty when it does not answer).
brokers_seen() {
	kcat -b "127.0.0.1:$(port_of "$1")" -L -m 3 2>/dev/null | awk '$1 == "broker" && $3 == "at" { print $2 }' || true
}

# wait_serving I WANT...: until node I's metadata lists every broker id in WANT, or the deadline.
wait_serving() {
	local i=$1 deadline=$2 seen id ok
	shift 2
	while :; do
		pid_of "$i" >/dev/null || die "node $i exited while starting; the end of $dir/node-$i/server.log:
$(tail -n 20 "$dir/node-$i/server.log" 2>/dev/null; tail -n 5 "$dir/node-$i/stdout.log" 2>/dev/null)"
		seen=$(brokers_seen "$i")
		ok=1
		for id in "$@"; do grep -qx "$id" <<<"$seen" || { ok=0 && break; }; done
		((ok)) && return 0
		((SECONDS < deadline)) || die "node $i did not list brokers $* within ${wait_s} s (it lists: $(echo $seen)); see $dir/node-$i/server.log"
		sleep 0.3
	done
}

up() {
	local n=${1:-3} i id all=()
	[[ $n =~ ^[0-9]+$ ]] && ((n >= 1)) || die "node count must be a positive number, not '$n'"
	need_libs
	if [[ -f $dir/cluster.env ]]; then
		load
		for ((i = 1; i <= nodes; i++)); do
			pid_of "$i" >/dev/null && die "a cluster is already running in $dir (scripts/kafka.sh down first)"
		done
	fi
	version=${KAFKA_VERSION:-4.4.0}
	home=$root/.deps/kafka-$version
	libs=$home/libs
	rm -rf "$dir"
	mkdir -p "$dir"
	dir=$(cd "$dir" && pwd)
	nodes=$n
	pick_ports "$n"
	local id_cluster start=$SECONDS
	# A cluster id is 16 random bytes in unpadded URL-safe base64, as StorageTool's random-uuid prints.
	id_cluster=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=')
	cat >"$dir/cluster.env" <<-EOF
		nodes=$n
		version=$version
		ports=(${ports[*]})
		cluster_id=$id_cluster
	EOF
	for ((i = 1; i <= n; i++)); do
		write_config "$i"
		java_cmd "$i"
		"${jcmd[@]}" kafka.tools.StorageTool format -t "$id_cluster" -c "$dir/node-$i/server.properties" \
			>"$dir/node-$i/format.log" 2>&1 &
	done
	for ((i = 1; i <= n; i++)); do
		wait -n || die "formatting a node's storage failed: $(cat "$dir"/node-*/format.log)"
	done
	for ((i = 1; i <= n; i++)); do launch "$i"; done
	for ((id = 1; id <= n; id++)); do all+=("$id"); done
	local deadline=$((SECONDS + wait_s))
	for ((i = 1; i <= n; i++)); do wait_serving "$i" "$deadline" "${all[@]}"; done
	echo "kafka.sh: $n nodes of Kafka $version up in $((SECONDS - start)) s in $dir" >&2
	echo "bootstrap=$(bootstrap_list)"
}

# end_nodes I...: SIGTERM to each running node, then up to the stop deadline for all of them to exit,
# SIGKILL for any left; stopped and killed count which way each went.
end_nodes() {
	local i pid list=() deadline=$((SECONDS + stop_s))
	stopped=0 killed=0
	for i in "$@"; do
		pid=$(pid_of "$i") || continue
		kill -CONT "$pid" 2>/dev/null || true # a paused JVM cannot act on SIGTERM
		kill -TERM "$pid" 2>/dev/null || true
		list+=("$i")
	done
	for i in "${list[@]}"; do
		while pid_of "$i" >/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
		if pid=$(pid_of "$i"); then
			kill -KILL "$pid" 2>/dev/null || true
			local d=$((SECONDS + 10))
			while pid_of "$i" >/dev/null; do
				((SECONDS < d)) || die "node $i (pid $pid) survived SIGKILL for 10 s"
				sleep 0.1
			done
			killed=$((killed + 1))
			echo "kafka.sh: node $i did not exit within ${stop_s} s of SIGTERM: SIGKILLed" >&2
		else
			stopped=$((stopped + 1))
		fi
	done
}

cmd=${1:-}
shift || true
case $cmd in
fetch) fetch ;;
libs)
	[[ -f $home/pins.sha256 ]] || { echo "Kafka $version's jars are not fetched: run make kafka" >&2 && exit 2; }
	echo "$libs"
	;;
up) up "$@" ;;
kill)
	load
	node_arg "${1:-}"
	if pid=$(pid_of "$1"); then
		kill -KILL "$pid"
		deadline=$((SECONDS + 10))
		while pid_of "$1" >/dev/null; do
			((SECONDS < deadline)) || die "node $1 (pid $pid) survived SIGKILL for 10 s"
			sleep 0.05
		done
		echo "kafka.sh: node $1 (pid $pid) SIGKILLed" >&2
	else
		echo "kafka.sh: node $1 is not running" >&2
	fi
	;;
stop)
	load
	node_arg "${1:-}"
	end_nodes "$1"
	echo "kafka.sh: node $1 stopped" >&2
	;;
start)
	load
	node_arg "${1:-}"
	need_libs
	if pid_of "$1" >/dev/null; then
		echo "kafka.sh: node $1 is already running" >&2
		exit 0
	fi
	launch "$1"
	if [[ ${KAFKA_NO_WAIT:-} != 1 ]]; then
		wait_serving "$1" $((SECONDS + wait_s)) "$1"
	fi
	echo "kafka.sh: node $1 started (pid $(<"$dir/node-$1/pid"))" >&2
	;;
pause | resume)
	load
	node_arg "${1:-}"
	pid=$(pid_of "$1") || die "node $1 is not running"
	if [[ $cmd == pause ]]; then kill -STOP "$pid"; else kill -CONT "$pid"; fi
	;;
pid)
	load
	node_arg "${1:-}"
	pid_of "$1" || exit 1
	;;
status)
	load
	for ((i = 1; i <= nodes; i++)); do
		if pid=$(pid_of "$i"); then
			state=$(awk '{ print $3 }' "/proc/$pid/stat")
			[[ $state == T ]] && state=paused || state=running
			echo "node $i: $state (pid $pid) 127.0.0.1:$(port_of "$i")"
		else
			echo "node $i: down 127.0.0.1:$(port_of "$i")"
		fi
	done
	echo "bootstrap=$(bootstrap_list)"
	;;
bootstrap)
	load
	echo "bootstrap=$(bootstrap_list)"
	;;
down)
	[[ -f $dir/cluster.env ]] || { echo "kafka.sh: no cluster in $dir" >&2 && exit 0; }
	load
	all=()
	for ((i = 1; i <= nodes; i++)); do all+=("$i"); done
	end_nodes "${all[@]}"
	echo "kafka.sh: down: $stopped nodes exited on SIGTERM, $killed SIGKILLed after ${stop_s} s" >&2
	;;
*)
	sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
	exit 2
	;;
esac
