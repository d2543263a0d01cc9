{{/* Labels of every object: one name, so selectors stay the same across upgrades. */}}
{{- define "lb-agent.labels" -}}
app.kubernetes.io/name: lb-agent
{{- end }}

{{- define "lb-agent.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The port of a host:port address (IPv6 hosts in brackets). */}}
{{- define "lb-agent.port" -}}
{{ regexReplaceAll "^.*:" . "" }}
{{- end }}

{{/* host:port of the apiserver, brackets around an IPv6 host; with
     k8sAPIServers, that list after it, comma-separated (the agent moves to
     the next when the one it watches stops answering). */}}
{{- define "lb-agent.apiServer" -}}
{{- include "lb-agent.firstApiServer" . -}}
{{- range .Values.k8sAPIServers -}},{{ . }}{{- end -}}
{{- end }}

{{- define "lb-agent.firstApiServer" -}}
{{- $host := required "k8sServiceHost: give the apiserver's real address (the control-plane endpoint, for example --set k8sServiceHost=10.0.0.10): without kube-proxy a pod's KUBERNETES_SERVICE_HOST is a ClusterIP nothing translates until this agent runs" .Values.k8sServiceHost -}}
{{- if and (contains ":" $host) (not (hasPrefix "[" $host)) -}}
[{{ $host }}]:{{ .Values.k8sServicePort }}
{{- else -}}
{{ $host }}:{{ .Values.k8sServicePort }}
{{- end }}
{{- end }}

{{/* "off" for a value YAML 1.1 read as false (a bare `off` in a values file). */}}
{{- define "lb-agent.offable" -}}
{{- if eq (toString .) "false" -}}off{{- else -}}{{ . }}{{- end -}}
{{- end }}
