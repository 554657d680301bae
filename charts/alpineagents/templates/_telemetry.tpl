{{/*
The OTEL_* variables of run pods, as a JSON object (the operator's ALPINEAGENTS_RUN_OTEL_ENV):
none unless `telemetry.otlpEndpoint` is set.
*/}}
{{- define "alpineagents.runOtelEnv" -}}
{{- $env := dict -}}
{{- with .Values.telemetry.otlpEndpoint -}}
{{- $_ := set $env "OTEL_EXPORTER_OTLP_ENDPOINT" . -}}
{{- $_ := set $env "OTEL_SERVICE_NAME" $.Values.telemetry.serviceName -}}
{{- if $.Values.telemetry.captureContent -}}
{{- $_ := set $env "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT" "true" -}}
{{- end -}}
{{- range $name, $value := $.Values.telemetry.env -}}
{{- $_ := set $env $name (toString $value) -}}
{{- end -}}
{{- end -}}
{{- if $env }}{{ toJson $env }}{{ end -}}
{{- end -}}
