package k8s

// The custom resources' fields this repository sets, written out by hand:
// the published Go types did not build here (CloudNativePG's module is not
// served by the module proxy; KEDA v2.21.0's apis need client-go v0.36,
// which does not build against k8s.io/api v0.37.2). Each field's JSON name
// and type is the one of the published types, read from their sources:
// github.com/cloudnative-pg/cloudnative-pg api/v1 (cluster_types.go,
// scheduledbackup_types.go), github.com/cloudnative-pg/barman-cloud pkg/api
// (config.go) and github.com/kedacore/keda apis/keda/v1alpha1
// (scaledobject_types.go, scaletriggers_types.go). Decoding strictly into
// them fails on a misspelt or misplaced field; a field this repository does
// not set yet must be added here, from those sources, before it is used.

import (
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

type cnpgCluster struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              cnpgClusterSpec `json:"spec"`
}

type cnpgClusterSpec struct {
	Instances                 int                               `json:"instances"`
	ImageName                 string                            `json:"imageName,omitempty"`
	PrimaryUpdateStrategy     string                            `json:"primaryUpdateStrategy,omitempty"`
	PostgreSQL                cnpgPostgres                      `json:"postgresql,omitempty"`
	Bootstrap                 *cnpgBootstrap                    `json:"bootstrap,omitempty"`
	Storage                   cnpgStorage                       `json:"storage,omitempty"`
	WalStorage                *cnpgStorage                      `json:"walStorage,omitempty"`
	Resources                 corev1.ResourceRequirements       `json:"resources,omitempty"`
	TopologySpreadConstraints []corev1.TopologySpreadConstraint `json:"topologySpreadConstraints,omitempty"`
	Affinity                  cnpgAffinity                      `json:"affinity,omitempty"`
	Backup                    *cnpgBackup                       `json:"backup,omitempty"`
}

type cnpgPostgres struct {
	Parameters  map[string]string `json:"parameters,omitempty"`
	Synchronous *cnpgSynchronous  `json:"synchronous,omitempty"`
}

type cnpgSynchronous struct {
	Method         string `json:"method"`
	Number         int    `json:"number"`
	DataDurability string `json:"dataDurability,omitempty"`
}

type cnpgBootstrap struct {
	InitDB *cnpgInitDB `json:"initdb,omitempty"`
}

type cnpgInitDB struct {
	Database string                       `json:"database,omitempty"`
	Owner    string                       `json:"owner,omitempty"`
	Secret   *corev1.LocalObjectReference `json:"secret,omitempty"`
}

type cnpgStorage struct {
	StorageClass *string `json:"storageClass,omitempty"`
	Size         string  `json:"size,omitempty"`
}

type cnpgAffinity struct {
	EnablePodAntiAffinity *bool  `json:"enablePodAntiAffinity,omitempty"`
	TopologyKey           string `json:"topologyKey,omitempty"`
	PodAntiAffinityType   string `json:"podAntiAffinityType,omitempty"`
}

type cnpgBackup struct {
	BarmanObjectStore *barmanObjectStore `json:"barmanObjectStore,omitempty"`
	RetentionPolicy   string             `json:"retentionPolicy,omitempty"`
	Target            string             `json:"target,omitempty"`
}

// barmanObjectStore is barman-cloud's BarmanObjectStoreConfiguration, its
// credentials inlined.
type barmanObjectStore struct {
	S3Credentials   *barmanS3Credentials `json:"s3Credentials,omitempty"`
	EndpointURL     string               `json:"endpointURL,omitempty"`
	DestinationPath string               `json:"destinationPath"`
	ServerName      string               `json:"serverName,omitempty"`
	Wal             *barmanCompression   `json:"wal,omitempty"`
	Data            *barmanCompression   `json:"data,omitempty"`
}

type barmanS3Credentials struct {
	AccessKeyID        *secretKeySelector `json:"accessKeyId,omitempty"`
	SecretAccessKey    *secretKeySelector `json:"secretAccessKey,omitempty"`
	Region             *secretKeySelector `json:"region,omitempty"`
	InheritFromIAMRole bool               `json:"inheritFromIAMRole,omitempty"`
}

// secretKeySelector is cloudnative-pg/machinery's: a name and a key.
type secretKeySelector struct {
	Name string `json:"name"`
	Key  string `json:"key"`
}

type barmanCompression struct {
	Compression string `json:"compression,omitempty"`
}

type cnpgScheduledBackup struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              cnpgScheduledBackupSpec `json:"spec"`
}

type cnpgScheduledBackupSpec struct {
	Schedule             string                      `json:"schedule"`
	Cluster              corev1.LocalObjectReference `json:"cluster"`
	BackupOwnerReference string                      `json:"backupOwnerReference,omitempty"`
	Method               string                      `json:"method,omitempty"`
}

type kedaScaledObject struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              kedaScaledObjectSpec `json:"spec"`
}

type kedaScaledObjectSpec struct {
	ScaleTargetRef  *kedaScaleTarget `json:"scaleTargetRef"`
	PollingInterval *int32           `json:"pollingInterval,omitempty"`
	CooldownPeriod  *int32           `json:"cooldownPeriod,omitempty"`
	MinReplicaCount *int32           `json:"minReplicaCount,omitempty"`
	MaxReplicaCount *int32           `json:"maxReplicaCount,omitempty"`
	Advanced        *kedaAdvanced    `json:"advanced,omitempty"`
	Triggers        []kedaTrigger    `json:"triggers"`
}

type kedaScaleTarget struct {
	Name       string `json:"name"`
	APIVersion string `json:"apiVersion,omitempty"`
	Kind       string `json:"kind,omitempty"`
}

type kedaAdvanced struct {
	ScalingModifiers kedaScalingModifiers `json:"scalingModifiers,omitempty"`
}

type kedaScalingModifiers struct {
	Formula          string                         `json:"formula,omitempty"`
	Target           string                         `json:"target,omitempty"`
	ActivationTarget string                         `json:"activationTarget,omitempty"`
	MetricType       autoscalingv2.MetricTargetType `json:"metricType,omitempty"`
}

type kedaTrigger struct {
	Type     string            `json:"type"`
	Name     string            `json:"name,omitempty"`
	Metadata map[string]string `json:"metadata"`
}

// natsJetStreamMetadata are the trigger metadata keys of KEDA's
// nats-jetstream scaler (pkg/scalers/nats_jetstream_scaler.go).
var natsJetStreamMetadata = map[string]bool{
	"natsServerMonitoringEndpoint": true, "account": true, "accountID": true,
	"stream": true, "consumer": true, "lagThreshold": true,
	"activationLagThreshold": true, "useHttps": true,
}
