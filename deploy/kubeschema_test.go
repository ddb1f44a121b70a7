package deploy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	"gopkg.in/yaml.v3"
)

// An offline schema for the Kubernetes manifests: the fields of the
// Kubernetes API objects (core/v1, apps/v1, policy/v1) that deploy/kubernetes
// uses, with their Kubernetes names and types. Each document is decoded
// strictly into its kind's type, so a misspelt or misplaced field, a wrong
// type or an unknown kind fails the test before any cluster sees it. It is
// a subset of the API, checked field by field against the API reference: a
// field the manifests start to use must be added here, on purpose. (The Go
// API types, k8s.io/api, would pull in the whole apimachinery for one test;
// kubeconform needs its schemas downloaded.)

type kubeMeta struct {
	Name        string            `yaml:"name"`
	Namespace   string            `yaml:"namespace"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

type kubeHeader struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
}

type kubeConfigMap struct {
	kubeHeader `yaml:",inline"`
	Metadata   kubeMeta          `yaml:"metadata"`
	Data       map[string]string `yaml:"data"`
}

type labelSelector struct {
	MatchLabels map[string]string `yaml:"matchLabels"`
}

type kubeStatefulSet struct {
	kubeHeader `yaml:",inline"`
	Metadata   kubeMeta `yaml:"metadata"`
	Spec       struct {
		ServiceName         string        `yaml:"serviceName"`
		Replicas            *int32        `yaml:"replicas"`
		PodManagementPolicy string        `yaml:"podManagementPolicy"`
		MinReadySeconds     int32         `yaml:"minReadySeconds"`
		Selector            labelSelector `yaml:"selector"`
		UpdateStrategy      struct {
			Type          string `yaml:"type"`
			RollingUpdate *struct {
				Partition      *int32 `yaml:"partition"`
				MaxUnavailable any    `yaml:"maxUnavailable"`
			} `yaml:"rollingUpdate"`
		} `yaml:"updateStrategy"`
		Template struct {
			Metadata kubeMeta    `yaml:"metadata"`
			Spec     kubePodSpec `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

type kubePodSpec struct {
	TerminationGracePeriodSeconds *int64 `yaml:"terminationGracePeriodSeconds"`
	Affinity                      *struct {
		PodAntiAffinity *struct {
			Required  []podAffinityTerm `yaml:"requiredDuringSchedulingIgnoredDuringExecution"`
			Preferred []struct {
				Weight          int32           `yaml:"weight"`
				PodAffinityTerm podAffinityTerm `yaml:"podAffinityTerm"`
			} `yaml:"preferredDuringSchedulingIgnoredDuringExecution"`
		} `yaml:"podAntiAffinity"`
	} `yaml:"affinity"`
	SecurityContext *struct {
		RunAsNonRoot   *bool  `yaml:"runAsNonRoot"`
		RunAsUser      *int64 `yaml:"runAsUser"`
		RunAsGroup     *int64 `yaml:"runAsGroup"`
		SeccompProfile *struct {
			Type string `yaml:"type"`
		} `yaml:"seccompProfile"`
	} `yaml:"securityContext"`
	Containers []kubeContainer `yaml:"containers"`
	Volumes    []struct {
		Name      string `yaml:"name"`
		ConfigMap *struct {
			Name string `yaml:"name"`
		} `yaml:"configMap"`
	} `yaml:"volumes"`
}

type podAffinityTerm struct {
	TopologyKey   string        `yaml:"topologyKey"`
	LabelSelector labelSelector `yaml:"labelSelector"`
}

type kubeProbe struct {
	HTTPGet *struct {
		Path string `yaml:"path"`
		Port any    `yaml:"port"` // a number or a port name
	} `yaml:"httpGet"`
	InitialDelaySeconds int32 `yaml:"initialDelaySeconds"`
	PeriodSeconds       int32 `yaml:"periodSeconds"`
	TimeoutSeconds      int32 `yaml:"timeoutSeconds"`
	FailureThreshold    int32 `yaml:"failureThreshold"`
	SuccessThreshold    int32 `yaml:"successThreshold"`
}

type kubeContainer struct {
	Name  string   `yaml:"name"`
	Image string   `yaml:"image"`
	Args  []string `yaml:"args"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int32  `yaml:"containerPort"`
		Protocol      string `yaml:"protocol"`
	} `yaml:"ports"`
	ReadinessProbe *kubeProbe `yaml:"readinessProbe"`
	LivenessProbe  *kubeProbe `yaml:"livenessProbe"`
	Lifecycle      *struct {
		PreStop *struct {
			Sleep *struct {
				Seconds int64 `yaml:"seconds"`
			} `yaml:"sleep"`
		} `yaml:"preStop"`
	} `yaml:"lifecycle"`
	Resources struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	SecurityContext *struct {
		AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
		ReadOnlyRootFilesystem   *bool `yaml:"readOnlyRootFilesystem"`
		Capabilities             *struct {
			Drop []string `yaml:"drop"`
		} `yaml:"capabilities"`
	} `yaml:"securityContext"`
	VolumeMounts []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
		ReadOnly  bool   `yaml:"readOnly"`
	} `yaml:"volumeMounts"`
}

type kubeService struct {
	kubeHeader `yaml:",inline"`
	Metadata   kubeMeta `yaml:"metadata"`
	Spec       struct {
		ClusterIP                string            `yaml:"clusterIP"`
		PublishNotReadyAddresses bool              `yaml:"publishNotReadyAddresses"`
		Selector                 map[string]string `yaml:"selector"`
		Ports                    []struct {
			Name       string `yaml:"name"`
			Port       int32  `yaml:"port"`
			TargetPort any    `yaml:"targetPort"`
			Protocol   string `yaml:"protocol"`
		} `yaml:"ports"`
	} `yaml:"spec"`
}

type kubePDB struct {
	kubeHeader `yaml:",inline"`
	Metadata   kubeMeta `yaml:"metadata"`
	Spec       struct {
		MaxUnavailable any           `yaml:"maxUnavailable"`
		MinAvailable   any           `yaml:"minAvailable"`
		Selector       labelSelector `yaml:"selector"`
	} `yaml:"spec"`
}

// kubeDocs are the decoded manifests, by kind; Services by name.
type kubeDocs struct {
	configMaps   []kubeConfigMap
	statefulSets []kubeStatefulSet
	services     map[string]kubeService
	pdbs         []kubePDB
}

// apiVersions is the apiVersion each kind must have.
var apiVersions = map[string]string{"ConfigMap": "v1", "Service": "v1", "StatefulSet": "apps/v1", "PodDisruptionBudget": "policy/v1"}

// decodeKube decodes every document of path strictly into its kind's type.
func decodeKube(path string) (kubeDocs, error) {
	docs := kubeDocs{services: map[string]kubeService{}}
	raw, err := os.ReadFile(path)
	if err != nil {
		return docs, err
	}
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	for i := 0; ; i++ {
		var node yaml.Node
		if err := dec.Decode(&node); errors.Is(err, io.EOF) {
			return docs, nil
		} else if err != nil {
			return docs, fmt.Errorf("%s: document %d: %w", path, i, err)
		}
		var h kubeHeader
		if err := node.Decode(&h); err != nil {
			return docs, fmt.Errorf("%s: document %d: %w", path, i, err)
		}
		if want, ok := apiVersions[h.Kind]; !ok {
			return docs, fmt.Errorf("%s: document %d: kind %q is not in the schema", path, i, h.Kind)
		} else if h.APIVersion != want {
			return docs, fmt.Errorf("%s: document %d: %s has apiVersion %q, want %q", path, i, h.Kind, h.APIVersion, want)
		}
		strict := func(v any) error {
			// Node.Decode has no strict mode: re-encode the document and
			// decode it with KnownFields.
			b, err := yaml.Marshal(&node)
			if err != nil {
				return err
			}
			d := yaml.NewDecoder(bytes.NewReader(b))
			d.KnownFields(true)
			if err := d.Decode(v); err != nil {
				return fmt.Errorf("%s: document %d (%s): %w", path, i, h.Kind, err)
			}
			return nil
		}
		switch h.Kind {
		case "ConfigMap":
			var v kubeConfigMap
			err = strict(&v)
			docs.configMaps = append(docs.configMaps, v)
		case "StatefulSet":
			var v kubeStatefulSet
			err = strict(&v)
			docs.statefulSets = append(docs.statefulSets, v)
		case "Service":
			var v kubeService
			err = strict(&v)
			docs.services[v.Metadata.Name] = v
		case "PodDisruptionBudget":
			var v kubePDB
			err = strict(&v)
			docs.pdbs = append(docs.pdbs, v)
		}
		if err != nil {
			return docs, err
		}
	}
}
