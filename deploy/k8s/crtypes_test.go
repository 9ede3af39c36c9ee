package k8s

// The custom resources' fields this repository sets, written out by hand:
// the published Go types did not build here (CloudNativePG's and
// barman-cloud's modules are not served by the module proxy, and the Barman
// Cloud Plugin's ObjectStore type needs barman-cloud; KEDA v2.21.0's apis
// need client-go v0.36, which does not build against k8s.io/api v0.37.2).
// Each field's JSON name and type is the one of the published types, read
// from their sources at the versions below: github.com/cloudnative-pg/
// cloudnative-pg api/v1 (cluster_types.go, scheduledbackup_types.go,
// backup_types.go), github.com/cloudnative-pg/plugin-barman-cloud api/v1
// (objectstore_types.go), github.com/cloudnative-pg/barman-cloud pkg/api
// (config.go) and github.com/kedacore/keda apis/keda/v1alpha1
// (scaledobject_types.go, scaletriggers_types.go). Decoding strictly into
// them fails on a misspelt or misplaced field; a field this repository does
// not set yet must be added here, from those sources, before it is used.
// The Cluster's deprecated in-tree backup (spec.backup.barmanObjectStore,
// removed in CloudNativePG 1.31) is left out on purpose: it does not decode.

import (
	"os"
	"strings"
	"testing"

	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The versions the types were read from, which deploy/README.md names as
// what an install needs at least.
const (
	cnpgVersion          = "1.30.0"
	cnpgMinVersion       = "1.26"
	barmanPluginVersion  = "0.14.0"
	barmanPluginMinMinor = "0.14"
	kedaMinVersion       = "2.12"
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
	Plugins                   []cnpgPlugin                      `json:"plugins,omitempty"`
}

// cnpgPlugin is CloudNativePG's PluginConfiguration.
type cnpgPlugin struct {
	Name          string            `json:"name"`
	Enabled       *bool             `json:"enabled,omitempty"`
	IsWALArchiver *bool             `json:"isWALArchiver,omitempty"`
	Parameters    map[string]string `json:"parameters,omitempty"`
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

// barmanObjectStore is barman-cloud's BarmanObjectStoreConfiguration, its
// credentials inlined: an ObjectStore's spec.configuration.
type barmanObjectStore struct {
	S3Credentials   *barmanS3Credentials `json:"s3Credentials,omitempty"`
	EndpointURL     string               `json:"endpointURL,omitempty"`
	EndpointCA      *secretKeySelector   `json:"endpointCA,omitempty"`
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
	Immediate            *bool                       `json:"immediate,omitempty"`
	Cluster              corev1.LocalObjectReference `json:"cluster"`
	BackupOwnerReference string                      `json:"backupOwnerReference,omitempty"`
	Target               string                      `json:"target,omitempty"`
	Method               string                      `json:"method,omitempty"`
	PluginConfiguration  *cnpgBackupPlugin           `json:"pluginConfiguration,omitempty"`
}

// cnpgBackupPlugin is CloudNativePG's BackupPluginConfiguration.
type cnpgBackupPlugin struct {
	Name       string            `json:"name"`
	Parameters map[string]string `json:"parameters,omitempty"`
}

// barmanObjectStoreCR is the Barman Cloud Plugin's ObjectStore.
type barmanObjectStoreCR struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Configuration   barmanObjectStore `json:"configuration"`
		RetentionPolicy string            `json:"retentionPolicy,omitempty"`
	} `json:"spec"`
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
	Fallback        *kedaFallback    `json:"fallback,omitempty"`
}

type kedaFallback struct {
	FailureThreshold int32  `json:"failureThreshold"`
	Replicas         int32  `json:"replicas"`
	Behavior         string `json:"behavior,omitempty"`
}

type kedaScaleTarget struct {
	Name       string `json:"name"`
	APIVersion string `json:"apiVersion,omitempty"`
	Kind       string `json:"kind,omitempty"`
}

type kedaAdvanced struct {
	HorizontalPodAutoscalerConfig *struct {
		Behavior *autoscalingv2.HorizontalPodAutoscalerBehavior `json:"behavior,omitempty"`
		Name     string                                         `json:"name,omitempty"`
	} `json:"horizontalPodAutoscalerConfig,omitempty"`
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

// TestOperatorVersionsNamed: deploy/README.md names the operators' versions
// an install needs at least, and the ones these types were read from.
func TestOperatorVersionsNamed(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"CloudNativePG " + cnpgMinVersion + " or later", cnpgVersion + "'s types", "the plugin's\n  " + barmanPluginVersion,
		"Barman Cloud\n  Plugin " + barmanPluginMinMinor + " or later", "KEDA " + kedaMinVersion + " or later"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("deploy/README.md does not say %q", want)
		}
	}
}
