#!/bin/bash
# KAFKA_* variables -> server.properties (as apache/kafka does: '___' -> '-', '__' -> '_',
# '_' -> '.'), storage formatted once, then the broker in the foreground.
set -euo pipefail
props=/var/lib/kafka/server.properties
: "${KAFKA_LOG_DIRS:=/var/lib/kafka/data}"
export KAFKA_LOG_DIRS
: > "$props"
while IFS='=' read -r name value; do
  case "$name" in
    KAFKA_HEAP_OPTS|KAFKA_OPTS|KAFKA_JVM_PERFORMANCE_OPTS|KAFKA_LOG4J_OPTS|KAFKA_VERSION) continue ;;
    KAFKA_*) ;;
    *) continue ;;
  esac
  key=${name#KAFKA_}
  key=${key,,}
  key=${key//___/-}
  key=${key//__/@}
  key=${key//_/.}
  key=${key//@/_}
  printf '%s=%s\n' "$key" "$value" >> "$props"
done < <(env)
cp=(-cp "/opt/kafka/libs/*" -Dlog4j2.configurationFile=/opt/kafka/config/log4j2.properties)
if [ ! -s "$KAFKA_LOG_DIRS/meta.properties" ]; then
  cluster_id=${CLUSTER_ID:-5L6g3nShT-eMCtK--X86sw}
  standalone=()
  grep -q '^controller\.quorum\.voters=' "$props" || standalone=(--standalone)
  java -Xmx256m "${cp[@]}" kafka.tools.StorageTool format "${standalone[@]}" \
    -t "$cluster_id" -c "$props"
fi
# shellcheck disable=SC2086
exec java ${KAFKA_HEAP_OPTS:--Xmx768m -Xms256m} -Djava.awt.headless=true ${KAFKA_OPTS:-} \
  "${cp[@]}" kafka.Kafka "$props"
