{{/*
lockgate.render: every object of one of k8s/'s kustomize source files (linked under files/),
with the chart's values applied where the overlays apply theirs (k8s/components/production,
cluster-name, the overlays' patches and replacements). Called with (list $ "files/<path>").
*/}}
{{- define "lockgate.render" -}}
{{- $root := index . 0 -}}
{{- $path := index . 1 -}}
{{- $content := $root.Files.Get $path -}}
{{- if not $content -}}
{{- fail (printf "lockgate chart: %s is missing or empty (files/ links into k8s/; package the chart from the repository)" $path) -}}
{{- end -}}
{{- range $doc := regexSplit "(?m)^---\\s*$" $content -1 }}
{{- $obj := fromYaml $doc -}}
{{- if $obj.kind }}
{{- $worker := $root.Values.workerCluster -}}
{{- $central := $root.Values.central -}}
{{- $labels := $obj.metadata.labels | default dict -}}
{{- $_ := set $labels "helm.sh/chart" (printf "%s-%s" $root.Chart.Name $root.Chart.Version) -}}
{{- $_ := set $labels "app.kubernetes.io/instance" $root.Release.Name -}}
{{- $_ := set $obj.metadata "labels" $labels -}}
{{- if eq $obj.kind "Deployment" }}
{{- range $container := $obj.spec.template.spec.containers }}
{{- $_ := set $container "image" (printf "%s:%s" $root.Values.image.repository $root.Values.image.tag) -}}
{{- if eq $obj.metadata.name "lockgate-webhook" }}
{{- $_ := set $container "resources" $worker.webhook.resources -}}
{{- else }}
{{- $_ := set $container "resources" $central.resources -}}
{{- end }}
{{- end }}
{{- if eq $obj.metadata.name "lockgate-webhook" }}
{{- $_ := set $obj.spec "replicas" $worker.webhook.replicas -}}
{{- end }}
{{- end }}
{{- if and (eq $obj.kind "ConfigMap") (eq $obj.metadata.name "lockgate-cluster") }}
{{- $_ := set $obj.data "name" $worker.name -}}
{{- end }}
{{- if and (eq $obj.kind "ConfigMap") (eq $obj.metadata.name "lockgate-config") }}
{{- range $key, $value := $central.config }}
{{- $_ := set $obj.data $key (toString $value) -}}
{{- end }}
{{- end }}
{{- if and (eq $obj.kind "ConfigMap") (eq $obj.metadata.name "lockgate-clusters") $central.clusters }}
{{- $data := dict -}}
{{- range $identity, $files := $central.clusters }}
{{- $_ := set $data $identity (ternary $files (toJson $files) (kindIs "string" $files)) -}}
{{- end }}
{{- $_ := set $obj "data" $data -}}
{{- end }}
{{- if eq $obj.kind "MutatingWebhookConfiguration" }}
{{- range $hook := $obj.webhooks }}
{{- $_ := set $hook.clientConfig.service "path" (printf "/mutate/%s" $worker.name) -}}
{{- if $worker.webhook.tls.ca }}
{{- $_ := set $hook.clientConfig "caBundle" ($worker.webhook.tls.ca | b64enc) -}}
{{- end }}
{{- end }}
{{- if $worker.webhook.tls.certManager }}
{{- $annotations := $obj.metadata.annotations | default dict -}}
{{- $_ := set $annotations "cert-manager.io/inject-ca-from" "lockgate-system/lockgate-webhook" -}}
{{- $_ := set $obj.metadata "annotations" $annotations -}}
{{- end }}
{{- end }}
---
{{ toYaml $obj }}
{{- end }}
{{- end }}
{{- end -}}
