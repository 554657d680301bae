{{/*
Names, labels and the few derived settings every template shares. Cross-field rules that a
JSON schema cannot say clearly are checked here with `fail`, so a bad combination stops
`helm install` with one sentence saying what to change.
*/}}

{{- define "alpineagents.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* "<release>-<chart>", or just the release name when it already contains the chart name. */}}
{{- define "alpineagents.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "alpineagents.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Recommended labels (https://kubernetes.io/docs/concepts/overview/working-with-objects/common-labels/).
Call with (dict "ctx" $ "component" "operator").
*/}}
{{- define "alpineagents.labels" -}}
{{- $ctx := .ctx -}}
helm.sh/chart: {{ include "alpineagents.chart" $ctx }}
{{ include "alpineagents.selectorLabels" . }}
app.kubernetes.io/version: {{ $ctx.Chart.AppVersion | quote }}
app.kubernetes.io/part-of: alpineagents
app.kubernetes.io/managed-by: {{ $ctx.Release.Service }}
{{- with $ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The labels a selector matches on: stable across upgrades (no versions in them). */}}
{{- define "alpineagents.selectorLabels" -}}
app.kubernetes.io/name: {{ include "alpineagents.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "alpineagents.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "alpineagents.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (printf "%s-operator" (include "alpineagents.fullname" .)) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false: name the existing ServiceAccount the operator runs as" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* ------------------------------------------------------------------ namespaces */}}

{{/* The namespaces the operator watches, as a list; empty list means cluster-wide. */}}
{{- define "alpineagents.watchedNamespaces" -}}
{{- if .Values.clusterWide -}}
{{- list | toJson -}}
{{- else if .Values.watchNamespaces -}}
{{- .Values.watchNamespaces | uniq | toJson -}}
{{- else -}}
{{- list .Release.Namespace | toJson -}}
{{- end -}}
{{- end -}}

{{/*
Where the chart puts the Secrets it creates: the release namespace (the operator reads the
store with them) plus every namespace where AgentRuns run.
*/}}
{{/*
Where the store Secret goes: only the release namespace (the operator's) when run pods get
credentials of their own, so no run namespace holds the broad key; else with the others.
*/}}
{{- define "alpineagents.storeSecretNamespaces" -}}
{{- if eq .Values.store.runCredentials "sts" -}}
{{- list .Release.Namespace | toJson -}}
{{- else -}}
{{- include "alpineagents.secretNamespaces" . -}}
{{- end -}}
{{- end -}}

{{- define "alpineagents.secretNamespaces" -}}
{{- $all := list .Release.Namespace -}}
{{- range (include "alpineagents.watchedNamespaces" . | fromJsonArray) }}{{ $all = append $all . }}{{ end -}}
{{- range .Values.secretNamespaces }}{{ $all = append $all . }}{{ end -}}
{{- $all | uniq | toJson -}}
{{- end -}}

{{/* ------------------------------------------------------------------ the store */}}

{{/* Whether the bundled MinIO is deployed: enabled, and no store of the user's own. */}}
{{- define "alpineagents.minio.deployed" -}}
{{- if and .Values.minio.enabled (not .Values.store.url) -}}true{{- end -}}
{{- end -}}

{{- define "alpineagents.minio.fullname" -}}
{{- printf "%s-minio" (include "alpineagents.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
MinIO's root password: the value given, else the one already in the cluster (so an upgrade
keeps it), else a new random one. Generated once per render and remembered, because the
MinIO Secret and the store Secrets must hold the same value.
*/}}
{{- define "alpineagents.minio.rootPassword" -}}
{{- if .Values.minio.rootPassword -}}
{{- .Values.minio.rootPassword -}}
{{- else -}}
{{- if not (hasKey .Values.minio "_renderedRootPassword") -}}
{{- $password := randAlphaNum 40 -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "alpineagents.minio.fullname" .) -}}
{{- if and $existing $existing.data (hasKey $existing.data "rootPassword") -}}
{{- $password = index $existing.data "rootPassword" | b64dec -}}
{{- end -}}
{{- $_ := set .Values.minio "_renderedRootPassword" $password -}}
{{- end -}}
{{- index .Values.minio "_renderedRootPassword" -}}
{{- end -}}
{{- end -}}

{{/* The store URL the operator and its pods use; with encryption, it says so. */}}
{{- define "alpineagents.storeUrl" -}}
{{- $url := include "alpineagents.plainStoreUrl" . -}}
{{- if .Values.encryption.enabled -}}
{{- printf "%s%sencrypted=true" $url (ternary "&" "?" (contains "?" $url)) -}}
{{- else -}}
{{- $url -}}
{{- end -}}
{{- end -}}

{{- define "alpineagents.plainStoreUrl" -}}
{{- if .Values.store.url -}}
{{- if not (regexMatch "^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[^?[:space:]]*)?([?][^[:space:]]*)?$" .Values.store.url) -}}
{{- fail (printf "store.url %q is not of the form s3://BUCKET/PREFIX?endpoint=HOST:PORT&secure=true|false (BUCKET: 3-63 lowercase letters, digits, '.' or '-'; only s3:// works in a cluster, since a file store cannot be shared by the pods of one run)" .Values.store.url) -}}
{{- end -}}
{{- .Values.store.url -}}
{{- else if .Values.minio.enabled -}}
{{- $prefix := trimAll "/" .Values.minio.prefix -}}
{{- printf "s3://%s/%s?endpoint=%s.%s.svc:%d&secure=false" .Values.minio.bucket $prefix (include "alpineagents.minio.fullname" .) .Release.Namespace (int .Values.minio.service.port) -}}
{{- else -}}
{{- fail "store.url is required when minio.enabled is false: set store.url=s3://BUCKET/PREFIX?endpoint=HOST:PORT (your S3 service), or leave minio.enabled=true for the bundled MinIO" -}}
{{- end -}}
{{- end -}}

{{/* Whether the chart creates the store-credentials Secret (and from which values). */}}
{{- define "alpineagents.store.createsSecret" -}}
{{- if not .Values.store.existingSecret -}}
{{- if .Values.store.url -}}
{{- if or .Values.store.accessKeyId .Values.store.secretAccessKey -}}
{{- if not (and .Values.store.accessKeyId .Values.store.secretAccessKey) -}}
{{- fail "store.accessKeyId and store.secretAccessKey go together: give both, or neither (and store.existingSecret instead)" -}}
{{- end -}}
true
{{- end -}}
{{- else if and (include "alpineagents.minio.deployed" .) (not .Values.minio.existingSecret) -}}
true
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The store-credentials Secret as JSON {"name", "accessKeyIdKey", "secretAccessKeyKey"}; name "" = none. */}}
{{- define "alpineagents.store.secret" -}}
{{- $fullname := include "alpineagents.fullname" . -}}
{{- if .Values.store.existingSecret -}}
{{- dict "name" .Values.store.existingSecret "accessKeyIdKey" .Values.store.accessKeyIdKey "secretAccessKeyKey" .Values.store.secretAccessKeyKey | toJson -}}
{{- else if include "alpineagents.store.createsSecret" . -}}
{{- dict "name" (printf "%s-store" $fullname) "accessKeyIdKey" "AWS_ACCESS_KEY_ID" "secretAccessKeyKey" "AWS_SECRET_ACCESS_KEY" | toJson -}}
{{- else if and (include "alpineagents.minio.deployed" .) .Values.minio.existingSecret -}}
{{- dict "name" .Values.minio.existingSecret "accessKeyIdKey" "rootUser" "secretAccessKeyKey" "rootPassword" | toJson -}}
{{- else -}}
{{- dict "name" "" "accessKeyIdKey" "" "secretAccessKeyKey" "" | toJson -}}
{{- end -}}
{{- end -}}

{{/*
Every Secret of the installation, as a JSON list: those the chart creates (its MinIO's root
key, the store's and the model's quick-start Secrets) and those it is given (existing store,
MinIO, model and encryption Secrets). The operator refuses an AgentRun that names one
(ALPINEAGENTS_PROTECTED_SECRETS): they hold keys run pods must only get from the operator.
*/}}
{{- define "alpineagents.protectedSecrets" -}}
{{- $fullname := include "alpineagents.fullname" . -}}
{{- $names := list -}}
{{- $store := include "alpineagents.store.secret" . | fromJson -}}
{{- if $store.name }}{{ $names = append $names $store.name }}{{ end -}}
{{- if include "alpineagents.store.createsSecret" . }}{{ $names = append $names (printf "%s-store" $fullname) }}{{ end -}}
{{- if include "alpineagents.minio.deployed" . -}}
{{- $names = append $names (default (include "alpineagents.minio.fullname" .) .Values.minio.existingSecret) -}}
{{- end -}}
{{- if include "alpineagents.anthropic.createsSecret" . }}{{ $names = append $names (printf "%s-anthropic" $fullname) }}{{ end -}}
{{- with .Values.anthropic.existingSecret }}{{ $names = append $names . }}{{ end -}}
{{- with .Values.encryption.existingSecret }}{{ $names = append $names . }}{{ end -}}
{{- $names | uniq | toJson -}}
{{- end -}}

{{/* ------------------------------------------------------------------ the model */}}

{{/* Whether the chart creates the API-key Secret: a key was given, or the echo model needs a placeholder. */}}
{{- define "alpineagents.anthropic.createsSecret" -}}
{{- if and (not .Values.anthropic.existingSecret) (or .Values.anthropic.apiKey .Values.echoModel.enabled) -}}true{{- end -}}
{{- end -}}

{{- define "alpineagents.anthropic.secretName" -}}
{{- default (printf "%s-anthropic" (include "alpineagents.fullname" .)) .Values.anthropic.existingSecret -}}
{{- end -}}

{{- define "alpineagents.echoModel.fullname" -}}
{{- printf "%s-echo-model" (include "alpineagents.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "alpineagents.pacer.fullname" -}}
{{- printf "%s-pacer" (include "alpineagents.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* ALPINEAGENTS_PACER for the pods: the shared limiter's URL when it is deployed. */}}
{{- define "alpineagents.pacer.url" -}}
{{- if .Values.pacing.enabled -}}
{{- printf "http://%s.%s.svc:%d" (include "alpineagents.pacer.fullname" .) .Release.Namespace (int .Values.pacing.port) -}}
{{- end -}}
{{- end -}}

{{/* ANTHROPIC_BASE_URL for the pods: the one given, else the echo model's when deployed. */}}
{{- define "alpineagents.anthropic.baseUrl" -}}
{{- if .Values.anthropic.baseUrl -}}
{{- .Values.anthropic.baseUrl -}}
{{- else if .Values.echoModel.enabled -}}
{{- printf "http://%s.%s.svc:%d" (include "alpineagents.echoModel.fullname" .) .Release.Namespace (int .Values.echoModel.port) -}}
{{- end -}}
{{- end -}}

{{/* ------------------------------------------------------------------ security */}}

{{/* The labels the operator puts on every agent pod (alpineagents_operator.kube.pods.run_labels). */}}
{{- define "alpineagents.runPodLabels" -}}
app.kubernetes.io/name: alpineagents
app.kubernetes.io/component: agent-run
app.kubernetes.io/managed-by: alpineagents-operator
{{- end -}}

{{/* NetworkPolicy peers: public addresses only (no private, shared, link-local or metadata ranges). */}}
{{- define "alpineagents.publicAddresses" -}}
- ipBlock:
    cidr: 0.0.0.0/0
    except: [10.0.0.0/8, 100.64.0.0/10, 127.0.0.0/8, 169.254.0.0/16, 172.16.0.0/12, 192.168.0.0/16]
{{- end -}}

{{- define "alpineagents.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "alpineagents.containerSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY from the store Secret; called with its JSON dict. */}}
{{- define "alpineagents.storeCredentialsEnv" -}}
{{- if .name -}}
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ .name }}
      key: {{ .accessKeyIdKey }}
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ .name }}
      key: {{ .secretAccessKeyKey }}
{{- end -}}
{{- end -}}

{{/* The operator's permissions on the objects it works with (Role or ClusterRole). */}}
{{/*
What owns the warm pool's waiting standbys (ALPINEAGENTS_WARM_POOL_OWNER): the operator's
own Role in each watched namespace, or its ClusterRole; `helm uninstall` deletes it and the
garbage collector takes the standbys with it. None without a pool, or without rbac.create.
*/}}
{{- define "alpineagents.warmPoolOwner" -}}
{{- if and .Values.rbac.create (gt (int .Values.runs.warmPool) 0) -}}
{{- $name := printf "%s-operator" (include "alpineagents.fullname" .) -}}
{{- if .Values.clusterWide -}}
ClusterRole/{{ $name }}-{{ .Release.Namespace }}
{{- else -}}
Role/{{ $name }}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "alpineagents.rbac.rules" -}}
- apiGroups: ["alpineagents.dev"]
  resources: ["agentruns"]
  {{- if .Values.retention.enabled }}
  # delete: a finished run past its ttlSecondsAfterFinished (retention.enabled).
  verbs: ["get", "list", "watch", "patch", "delete"]
  {{- else }}
  verbs: ["get", "list", "watch", "patch"]
  {{- end }}
- apiGroups: ["alpineagents.dev"]
  resources: ["agentruns/status"]
  verbs: ["patch"]
- apiGroups: [""]
  resources: ["pods"]
  {{- if gt (int .Values.runs.warmPool) 0 }}
  # patch: a standby of the warm pool handed a run gets the run's labels and owner.
  verbs: ["list", "watch", "create", "delete", "patch"]
  {{- else }}
  verbs: ["list", "watch", "create", "delete"]
  {{- end }}
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- if .Values.schedules.enabled }}
# AgentSchedules (schedules.enabled): read them and write their status; create the runs
# they schedule, delete those Replace ends or past their history limits.
- apiGroups: ["alpineagents.dev"]
  resources: ["agentschedules"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["alpineagents.dev"]
  resources: ["agentschedules/status"]
  verbs: ["patch"]
- apiGroups: ["alpineagents.dev"]
  resources: ["agentruns"]
  verbs: ["create", "delete"]
{{- end }}
# Each pod's spec and (runCredentials=sts) each run's short-lived store credentials, in
# Secrets the run owns: written, never read (no get/list/watch: without notifications the
# operator cannot read any Secret), never deleted (they go with their AgentRun).
- apiGroups: [""]
  resources: ["secrets"]
  {{- if gt (int .Values.runs.warmPool) 0 }}
  # delete: a standby removed from the warm pool takes its credentials Secret with it.
  verbs: ["create", "patch", "delete"]
  {{- else }}
  verbs: ["create", "patch"]
  {{- end }}
{{- if .Values.notifications.enabled }}
# get: the auth header's value a run's spec.notify names (notifications.enabled). Never
# list or watch; the Secrets of the installation are refused by name.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get"]
{{- end }}
{{- end -}}

{{/* The viewer's permissions (see viewer.yaml): read AgentRuns; patch them to answer. */}}
{{- define "alpineagents.viewer.rules" -}}
- apiGroups: ["alpineagents.dev"]
  resources: ["agentruns"]
  verbs: {{ if .Values.viewer.allowApprovals }}["get", "list", "patch"]{{ else }}["get", "list"]{{ end }}
{{- end -}}

{{/*
Rules across several values, checked once (from configmap.yaml, which always renders).
Types, ranges and formats of single values are in values.schema.json.
*/}}
{{- /* The Lease the operator replicas elect their leader with (see leadership.py). */ -}}
{{- define "alpineagents.leaseName" -}}
{{- printf "%s-operator" (include "alpineagents.fullname" .) -}}
{{- end -}}

{{- define "alpineagents.validate" -}}
{{- if and .Values.clusterWide .Values.watchNamespaces -}}
{{- fail "clusterWide=true watches every namespace, so watchNamespaces must stay empty (to create the quick-start Secrets in more namespaces, list them in secretNamespaces)" -}}
{{- end -}}
{{- if and .Values.anthropic.existingSecret .Values.anthropic.apiKey -}}
{{- fail "give either anthropic.existingSecret (a Secret you made) or anthropic.apiKey (the chart makes the Secret), not both" -}}
{{- end -}}
{{- if and .Values.encryption.enabled (not .Values.encryption.existingSecret) -}}
{{- fail "encryption.enabled needs encryption.existingSecret: a Secret with the keyring (make a key with: python -m alpineagents.store.encrypted new-key k1)" -}}
{{- end -}}
{{- if and .Values.store.existingSecret (or .Values.store.accessKeyId .Values.store.secretAccessKey) -}}
{{- fail "give either store.existingSecret (a Secret you made) or store.accessKeyId + store.secretAccessKey (the chart makes the Secret), not both" -}}
{{- end -}}
{{- if and (not .Values.store.url) (or .Values.store.accessKeyId .Values.store.secretAccessKey .Values.store.existingSecret) -}}
{{- if .Values.minio.enabled -}}
{{- fail "store credentials were given but store.url is empty: set store.url to your S3 endpoint, or drop the store credentials to use the bundled MinIO (its credentials are minio.rootUser/minio.rootPassword or minio.existingSecret)" -}}
{{- end -}}
{{- end -}}
{{- with .Values.operator.leaderElection -}}
{{- if not (and (lt (float64 .retrySeconds) (float64 .renewDeadlineSeconds)) (lt (float64 .renewDeadlineSeconds) (float64 .leaseSeconds))) -}}
{{- fail (printf "operator.leaderElection needs retrySeconds < renewDeadlineSeconds < leaseSeconds (a leader must stop acting before its lease can be taken), got %v < %v < %v" .retrySeconds .renewDeadlineSeconds .leaseSeconds) -}}
{{- end -}}
{{- end -}}
{{- $_ := include "alpineagents.storeUrl" . -}}
{{- $_ = include "alpineagents.store.createsSecret" . -}}
{{- $_ = include "alpineagents.serviceAccountName" . -}}
{{- end -}}

{{/*
The agent pods' ServiceAccount: runs.serviceAccountName, else the one the chart makes
(runs.serviceAccount.create), else "" (the namespace's default).
*/}}
{{- define "alpineagents.runServiceAccountName" -}}
{{- if .Values.runs.serviceAccountName -}}
{{- .Values.runs.serviceAccountName -}}
{{- else if .Values.runs.serviceAccount.create -}}
{{- .Values.runs.serviceAccount.name | default (printf "%s-run" (include "alpineagents.fullname" .)) -}}
{{- end -}}
{{- end }}
