{{/* Names, labels, and the settings every rollout container gets. */}}
{{- define "rollout.name" -}}{{ .Chart.Name }}{{- end -}}

{{- define "rollout.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}{{ .Release.Name | trunc 50 | trimSuffix "-" }}
{{- else -}}{{ printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" }}{{- end -}}
{{- end -}}

{{- define "rollout.labels" -}}
app.kubernetes.io/name: {{ include "rollout.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* A component's pods; with .model (a model's slug) only those of the engine serving that model: each
policyModels entry's engine Deployment selects its own pods by it, and keeps the component `engine` that the
NetworkPolicies select. */}}
{{- define "rollout.selector" -}}
app.kubernetes.io/name: {{ include "rollout.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- with .model }}
rollout.dev/model: {{ . }}
{{- end }}
{{- end -}}

{{/* A model's name as part of a DNS label (lowercase letters and digits, `-` between): it names a policy's
engine Deployment, its pull init container and its pods' rollout.dev/model label. */}}
{{- define "rollout.modelSlug" -}}
{{- regexReplaceAll "[^a-z0-9]+" (lower .) "-" | trimAll "-" | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{/* The policyModels entries' models, as JSON (`include … | fromJsonArray`). */}}
{{- define "rollout.policyModels" -}}
{{- $models := list -}}
{{- range .Values.policyModels }}{{ $models = append $models .model }}{{ end -}}
{{- toJson $models -}}
{{- end -}}

{{/* A policyModels entry's engine settings (.entry, the .index-th): the engine section, each key the
entry's engine gives replacing the section's whole (so `gpus: 0` or `device: ""` take). Its port is the
engine port plus 1 + .index unless given: two engines sharing a Ray worker then never bind one port.
Written into .into (a template returns no dict). */}}
{{- define "rollout.policyEngine" -}}
{{- range $key, $value := deepCopy .root.Values.engine }}{{ $_ := set $.into $key $value }}{{ end -}}
{{- $_ := set .into "port" (add .root.Values.engine.port 1 .index) -}}
{{- range $key, $value := deepCopy (default (dict) .entry.engine) }}{{ $_ := set $.into $key $value }}{{ end -}}
{{- end -}}

{{/* A policyModels entry's trainer settings (.entry): the trainer section, each key the entry's trainer gives
replacing the section's whole (placement, gpus, rayGroup, device, resources, preset). Written into .into. */}}
{{- define "rollout.policyTrainer" -}}
{{- range $key, $value := deepCopy .root.Values.trainer }}{{ $_ := set $.into $key $value }}{{ end -}}
{{- range $key, $value := deepCopy (default (dict) .entry.trainer) }}{{ $_ := set $.into $key $value }}{{ end -}}
{{- end -}}

{{- define "rollout.image" -}}{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}{{- end -}}
{{- define "rollout.gpuImage" -}}{{ .Values.image.gpuRepository }}:{{ .Values.image.tag | default .Chart.AppVersion }}{{- end -}}

{{- define "rollout.secretName" -}}{{ .Values.secrets.existingSecret | default (printf "%s-secrets" (include "rollout.fullname" .)) }}{{- end -}}

{{- define "rollout.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}{{ .Values.serviceAccount.name | default (include "rollout.fullname" .) }}
{{- else -}}{{ .Values.serviceAccount.name | default "default" }}{{- end -}}
{{- end -}}

{{/* Where the services are: the user's, or the chart's dev ones. */}}
{{- define "rollout.devPostgres" -}}{{ if and (not .Values.services.postgres.url) .Values.services.postgres.dev }}true{{ end }}{{- end -}}
{{- define "rollout.postgresUrl" -}}
{{- if .Values.services.postgres.url -}}{{ .Values.services.postgres.url }}
{{- else -}}postgresql://rollout@{{ include "rollout.fullname" . }}-postgres:5432/rollout{{- end -}}
{{- end -}}

{{/* The ledger's logins (.login): owner (it owns the database and migrates it: the migrate init containers
only), worker (the services), reader (the dashboard), sandbox (the command hosts). Each has
its own password in its own Secret; the dev Postgres's superuser (postgres) is only that pod's. */}}
{{- define "rollout.ledgerRole" -}}rollout_{{ . }}{{- end -}}
{{/* The services' ledger logins: each writer kind's (rollout.config.LedgerWriter), the worker's (which may write
anything: the Ray pods, where a trainer and engines share a pod), the dashboard's and the command hosts'. */}}
{{- define "rollout.serviceLogins" -}}gateway runner trainer serving worker reader sandbox{{- end -}}
{{- define "rollout.ledgerUrl" -}}
{{- $given := get .root.Values.services.postgres (printf "%s_url" .login) -}}
{{- if eq .login "owner" -}}{{ include "rollout.postgresUrl" .root }}
{{- else if $given -}}{{ $given }}
{{- else -}}
{{- /* The owner's server and database, as the login's role (and no password: that is PGPASSWORD). */ -}}
{{- $url := urlParse (include "rollout.postgresUrl" .root) -}}
{{- $_ := set $url "userinfo" (include "rollout.ledgerRole" .login) -}}
{{- urlJoin $url -}}
{{- end -}}
{{- end -}}
{{- define "rollout.passwordKey" -}}{{ if eq . "owner" }}databasePassword{{ else }}{{ . }}Password{{ end }}{{- end -}}
{{- define "rollout.passwordSecret" -}}
{{- if .root.Values.secrets.existingSecret -}}{{ .root.Values.secrets.existingSecret }}
{{- else if eq .login "postgres" -}}{{ include "rollout.fullname" .root }}-postgres
{{- else -}}{{ include "rollout.fullname" .root }}-ledger-{{ .login }}{{- end -}}
{{- end -}}
{{- define "rollout.passwordRef" -}}
{secretKeyRef: {name: {{ include "rollout.passwordSecret" . }}, key: {{ include "rollout.passwordKey" .login }}}}
{{- end -}}
{{/* The sandbox key: one for the runners that claim sandboxes and the hosts that serve them. */}}
{{- define "rollout.sandboxKeySecret" -}}{{ .Values.secrets.existingSecret | default (printf "%s-sandbox-key" (include "rollout.fullname" .)) }}{{- end -}}
{{- define "rollout.temporalAddress" -}}{{ .Values.services.temporal.address | default (printf "%s-temporal:7233" (include "rollout.fullname" .)) }}{{- end -}}
{{- define "rollout.s3Endpoint" -}}{{ .Values.services.blobs.s3_endpoint | default (printf "%s-minio:9000" (include "rollout.fullname" .)) }}{{- end -}}
{{- define "rollout.gatewayUrl" -}}http://{{ include "rollout.fullname" . }}-gateway:{{ .Values.gateway.port }}{{- end -}}
{{- define "rollout.rayAddress" -}}ray://{{ include "rollout.fullname" . }}-ray-head-svc:10001{{- end -}}
{{- define "rollout.engineUrl" -}}http://{{ include "rollout.fullname" . }}-engine:{{ .Values.engine.port }}{{- end -}}

{{/* The ledger a process uses (.login, as above): its URL as settings, quoted for Hydra. The owner's is
services.postgres.url; a service's is its role's setting. The dashboard reads worker_url today (reader_url once
it reads that), so it is given its reader URL as both: either way it connects as rollout_reader. */}}
{{- define "rollout.ledgerSettings" -}}
{{- $url := include "rollout.ledgerUrl" . | squote -}}
{{- if eq .login "owner" }}
- services.postgres.url={{ $url }}
{{- else }}
- services.postgres.{{ .login }}_url={{ $url }}
{{- if eq .login "reader" }}
- services.postgres.worker_url={{ $url }}
{{- end }}
{{- end }}
{{- end -}}
{{/* Its password, as libpq reads it (PGPASSWORD): never in a URL, an argument or a ConfigMap. */}}
{{- define "rollout.ledgerEnv" -}}
- name: PGPASSWORD
  valueFrom: {{ include "rollout.passwordRef" . }}
{{- end -}}

{{/* The settings (command-line overrides) every rollout process takes, less the ledger's (above); URLs
quoted for Hydra. No secret is among them: the ledger's password reaches libpq as PGPASSWORD, S3 keys as
AWS_*. */}}
{{- define "rollout.settings" -}}
- data_dir=/data
- models_dir=/data/models
- services.temporal.address={{ include "rollout.temporalAddress" . | squote }}
{{- with .Values.services.temporal.tlsSecret }}
- services.temporal.tls_ca=/etc/rollout/temporal-tls/ca.crt
- services.temporal.tls_cert=/etc/rollout/temporal-tls/tls.crt
- services.temporal.tls_key=/etc/rollout/temporal-tls/tls.key
{{- end }}
{{- with .Values.services.temporal.tlsServerName }}
- services.temporal.tls_server_name={{ . | squote }}
{{- end }}
- services.blobs.url={{ .Values.services.blobs.url | squote }}
- services.blobs.s3_endpoint={{ include "rollout.s3Endpoint" . | squote }}
- services.blobs.s3_secure={{ .Values.services.blobs.s3_secure }}
- services.gateway.model={{ .Values.model }}
- services.gateway.max_context={{ .Values.maxContext }}
- gpu.mode={{ .Values.trainer.gpuMode }}
{{- range .Values.extraSettings }}
- {{ . | quote }}
{{- end }}
{{- end -}}

{{/* Before a rollout container starts: the ledger at the newest schema (idempotent; migrators take turns), as
its owner: the only containers given the owner's password; and each of .models (the models the pod loads: the
chart's, policyModels') pulled into /data/models (`rollout models pull`: built-in ones are built; it uses no
ledger), one init container each: `models` for the chart's model, `models-SLUG` for another. */}}
{{- define "rollout.initContainers" -}}
{{- $root := .root -}}
- name: migrate
  image: {{ include "rollout.image" $root }}
  imagePullPolicy: {{ $root.Values.image.pullPolicy }}
  args:
    - ledger
    - migrate
    - --wait-s
    - "600"
    {{- include "rollout.settings" $root | nindent 4 }}
    {{- include "rollout.ledgerSettings" (dict "root" $root "login" "owner") | nindent 4 }}
  env:
    {{- include "rollout.env" $root | nindent 4 }}
    {{- include "rollout.ledgerEnv" (dict "root" $root "login" "owner") | nindent 4 }}
  resources:
    requests: {cpu: 100m, memory: 256Mi}
    limits: {memory: 512Mi}
  securityContext:
    {{- toYaml $root.Values.securityContext | nindent 4 }}
{{- if $root.Values.models.pull }}
{{- range .models }}
- name: {{ if eq . $root.Values.model }}models{{ else }}models-{{ include "rollout.modelSlug" . }}{{ end }}
  image: {{ include "rollout.image" $root }}
  imagePullPolicy: {{ $root.Values.image.pullPolicy }}
  args:
    - models
    - pull
    - {{ . }}
    {{- include "rollout.settings" $root | nindent 4 }}
  env:
    {{- include "rollout.env" $root | nindent 4 }}
  resources:
    requests: {cpu: 250m, memory: 1Gi}
    limits: {memory: 4Gi}
  securityContext:
    {{- toYaml $root.Values.securityContext | nindent 4 }}
  volumeMounts:
    - {name: data, mountPath: /data}
{{- end }}
{{- end }}
{{- end -}}

{{/* The environment every rollout container gets: the data directory. What only some use is apart: the
ledger's password of the login it uses (`rollout.ledgerEnv`), blob store keys (`rollout.blobEnv`: engines
and trainers), Tinker's key (`rollout.tinkerEnv`: engines and trainers), Ray's token (`rollout.rayEnv`: the
engine and trainer drivers), the model providers' keys (`rollout.providerEnv`: the gateway, which calls
external models). */}}
{{- define "rollout.env" -}}
- name: ROLLOUT_DATA_DIR
  value: /data
{{- end -}}
{{- define "rollout.blobEnv" -}}
- name: AWS_ACCESS_KEY_ID
  valueFrom: {secretKeyRef: {name: {{ include "rollout.secretName" . }}, key: s3AccessKey}}
- name: AWS_SECRET_ACCESS_KEY
  valueFrom: {secretKeyRef: {name: {{ include "rollout.secretName" . }}, key: s3SecretKey}}
{{- end -}}
{{- define "rollout.tinkerEnv" -}}
- name: TINKER_API_KEY
  valueFrom: {secretKeyRef: {name: {{ include "rollout.secretName" . }}, key: tinkerApiKey, optional: true}}
{{- end -}}
{{- define "rollout.rayEnv" -}}
{{- if .Values.ray.enabled }}
- name: RAY_AUTH_MODE
  value: token
- name: RAY_AUTH_TOKEN
  valueFrom: {secretKeyRef: {name: {{ include "rollout.secretName" . }}, key: auth_token}}
{{- end }}
{{- end -}}
{{- define "rollout.providerEnv" -}}
- name: ANTHROPIC_API_KEY
  valueFrom: {secretKeyRef: {name: {{ include "rollout.secretName" . }}, key: anthropicApiKey, optional: true}}
- name: OPENAI_API_KEY
  valueFrom: {secretKeyRef: {name: {{ include "rollout.secretName" . }}, key: openaiApiKey, optional: true}}
{{- end -}}

{{- define "rollout.podSecurity" -}}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- end -}}

{{/* What a pod that runs the policy's commands in bubblewrap jails adds (values' `jail`): at the pod, its own
user namespace and the runtime class; at its container (`rollout.jailSecurityContext`), an unmasked /proc and
the seccomp and AppArmor profiles that let bubblewrap make namespaces, over the chart's securityContext. */}}
{{- define "rollout.jailPod" -}}
hostUsers: {{ .Values.jail.hostUsers }}
{{- with .Values.jail.runtimeClassName }}
runtimeClassName: {{ . }}
{{- end }}
{{- end -}}
{{- define "rollout.jailSecurityContext" -}}
{{- $jail := dict "procMount" .Values.jail.procMount "seccompProfile" .Values.jail.seccompProfile "appArmorProfile" .Values.jail.appArmorProfile -}}
{{- toYaml (merge $jail (deepCopy .Values.securityContext)) }}
{{- end -}}

{{/* The data directory, and the keys a component uses (.keys: gatewaySecret, operatorKey, engineKey: the key
engines sign their serving acks with, which the gateway checks; servingKey: the key the trainer signs serving
targets with, derived from the engine key; commandKey: the command hosts' kind key, derived from the sandbox
key; sandboxKey: the key runners prove sandbox claims
with, from its own Secret) as its files; no component is given a key it does not use. */}}
{{- define "rollout.dataMounts" -}}
- {name: data, mountPath: /data}
{{- if has "sandboxKey" .keys }}
- {name: sandbox-key, mountPath: /data/sandbox.key, subPath: sandboxKey, readOnly: true}
{{- end }}
{{- if has "commandKey" .keys }}
- {name: sandbox-key, mountPath: /data/sandbox-command.key, subPath: commandKey, readOnly: true}
{{- end }}
{{- if has "gatewaySecret" .keys }}
- {name: keys, mountPath: /data/gateway.secret, subPath: gatewaySecret, readOnly: true}
{{- end }}
{{- if has "operatorKey" .keys }}
- {name: keys, mountPath: /data/operator.key, subPath: operatorKey, readOnly: true}
{{- end }}
{{- if has "engineKey" .keys }}
- {name: keys, mountPath: /data/engine.key, subPath: engineKey, readOnly: true}
{{- end }}
{{- if has "servingKey" .keys }}
- {name: keys, mountPath: /data/serving.key, subPath: servingKey, readOnly: true}
{{- end }}
{{- if and (has "temporalTls" .keys) .root.Values.services.temporal.tlsSecret }}
- {name: temporal-tls, mountPath: /etc/rollout/temporal-tls, readOnly: true}
{{- end }}
{{- end -}}
{{- define "rollout.dataVolumes" -}}
- name: data
  emptyDir: {}
{{- $keys := without .keys "sandboxKey" "commandKey" "temporalTls" }}
{{- if and (has "temporalTls" .keys) .root.Values.services.temporal.tlsSecret }}
- name: temporal-tls
  secret:
    secretName: {{ .root.Values.services.temporal.tlsSecret }}
    defaultMode: 0440
{{- end }}
{{- if $keys }}
- name: keys
  secret:
    secretName: {{ include "rollout.secretName" .root }}
    defaultMode: 0440
    items:
      {{- range $keys }}
      - {key: {{ . }}, path: {{ . }}}
      {{- end }}
{{- end }}
{{- $sandboxKeys := list }}
{{- range (list "sandboxKey" "commandKey") }}{{ if has . $.keys }}{{ $sandboxKeys = append $sandboxKeys . }}{{ end }}{{ end }}
{{- if $sandboxKeys }}
- name: sandbox-key
  secret:
    secretName: {{ include "rollout.sandboxKeySecret" .root }}
    defaultMode: 0440
    items:
      {{- range $sandboxKeys }}
      - {key: {{ . }}, path: {{ . }}}
      {{- end }}
{{- end }}
{{- end -}}

{{/* --placement ray: the driver's options (a role placed on the RayCluster). .role is engine or trainer;
.settings, when given, are the role's settings (a policyModels entry's engine), else its section of the
values. */}}
{{- define "rollout.placement" -}}
{{- $role := .settings | default (get .root.Values .role) -}}
{{- if eq $role.placement "ray" }}
- --placement
- ray
- --ray-address
- {{ include "rollout.rayAddress" .root }}
- --gpus
- {{ $role.gpus | quote }}
{{- with $role.rayGroup }}
- --ray-group
- {{ . }}
{{- end }}
{{- end }}
{{- end -}}
