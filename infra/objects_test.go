package infra_test

import (
	"bytes"
	"fmt"
	"regexp"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// httpScaledObject mirrors the fields of KEDA HTTP add-on's
// http.keda.sh/v1alpha1 HTTPScaledObject that the manifests use (v0.8+
// layout). Decoded strictly, a field this struct lacks is an error: a new
// field needs a look at the add-on's reference, not a silent pass. KEDA's
// own Go types would bring the controller-runtime tree for four fields.
type httpScaledObject struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Hosts          []string `json:"hosts"`
		PathPrefixes   []string `json:"pathPrefixes,omitempty"`
		ScaleTargetRef struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Name       string `json:"name"`
			Service    string `json:"service"`
			Port       int32  `json:"port"`
		} `json:"scaleTargetRef"`
		Replicas struct {
			Min *int32 `json:"min"`
			Max *int32 `json:"max"`
		} `json:"replicas"`
		ScaledownPeriod *int32 `json:"scaledownPeriod,omitempty"`
		ScalingMetric   struct {
			Concurrency *struct {
				TargetValue int `json:"targetValue"`
			} `json:"concurrency,omitempty"`
			RequestRate *struct {
				Granularity string `json:"granularity,omitempty"`
				TargetValue int    `json:"targetValue"`
				Window      string `json:"window,omitempty"`
			} `json:"requestRate,omitempty"`
		} `json:"scalingMetric"`
	} `json:"spec"`
}

// scaledObject mirrors the fields of KEDA's keda.sh/v1alpha1 ScaledObject
// (KEDA 2.12+) that the manifests use, strictly like httpScaledObject. A
// trigger's metadata is KEDA's own string map: each scaler reads its keys,
// which checkScaledObjects checks for the redis scaler.
type scaledObject struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		ScaleTargetRef struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Name       string `json:"name"`
		} `json:"scaleTargetRef"`
		PollingInterval *int32 `json:"pollingInterval,omitempty"`
		CooldownPeriod  *int32 `json:"cooldownPeriod,omitempty"`
		MinReplicaCount *int32 `json:"minReplicaCount,omitempty"`
		MaxReplicaCount *int32 `json:"maxReplicaCount,omitempty"`
		Advanced        *struct {
			HorizontalPodAutoscalerConfig *struct {
				Name     string                                         `json:"name,omitempty"`
				Behavior *autoscalingv2.HorizontalPodAutoscalerBehavior `json:"behavior,omitempty"`
			} `json:"horizontalPodAutoscalerConfig,omitempty"`
		} `json:"advanced,omitempty"`
		Triggers []scaleTrigger `json:"triggers"`
	} `json:"spec"`
}

// scaleTrigger is one of a ScaledObject's triggers.
type scaleTrigger struct {
	Type              string            `json:"type"`
	Name              string            `json:"name,omitempty"`
	MetricType        string            `json:"metricType,omitempty"`
	Metadata          map[string]string `json:"metadata"`
	AuthenticationRef *struct {
		Name string `json:"name"`
		Kind string `json:"kind,omitempty"`
	} `json:"authenticationRef,omitempty"`
}

// triggerAuthentication mirrors KEDA's keda.sh/v1alpha1
// TriggerAuthentication as far as the manifests use it: parameters from
// Secret keys.
type triggerAuthentication struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		SecretTargetRef []secretTargetRef `json:"secretTargetRef"`
	} `json:"spec"`
}

// secretTargetRef is a scaler parameter from a Secret's key.
type secretTargetRef struct {
	Parameter string `json:"parameter"`
	Name      string `json:"name"`
	Key       string `json:"key"`
}

// prometheusRule mirrors the Prometheus Operator's monitoring.coreos.com/v1
// PrometheusRule: its spec is a rule file's groups, decoded strictly into
// the type the rule file itself is read with (ruleFile).
type prometheusRule struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              ruleFile `json:"spec"`
}

// objects is one set of manifests: a file, or an overlay as kustomize
// renders it.
type objects struct {
	Namespaces      []corev1.Namespace
	ServiceAccounts []corev1.ServiceAccount
	ConfigMaps      []corev1.ConfigMap
	Secrets         []corev1.Secret
	Services        []corev1.Service
	Deployments     []appsv1.Deployment
	StatefulSets    []appsv1.StatefulSet
	HPAs            []autoscalingv2.HorizontalPodAutoscaler
	PDBs            []policyv1.PodDisruptionBudget
	NetworkPolicies []networkingv1.NetworkPolicy
	HTTPScaled      []httpScaledObject
	Scaled          []scaledObject
	TriggerAuths    []triggerAuthentication
	Roles           []rbacv1.Role
	RoleBindings    []rbacv1.RoleBinding
	PrometheusRules []prometheusRule
}

var docSeparator = regexp.MustCompile(`(?m)^---[ \t]*$`)

// add decodes every YAML document in data strictly (unknown or duplicate
// fields are errors) into the API type its apiVersion and kind name; a
// kind this project does not use is an error too.
func (o *objects) add(data []byte) error {
	for i, doc := range docSeparator.Split(string(data), -1) {
		if len(bytes.TrimSpace(stripComments([]byte(doc)))) == 0 {
			continue
		}
		if err := o.addOne([]byte(doc)); err != nil {
			return fmt.Errorf("document %d: %w", i+1, err)
		}
	}
	return nil
}

// decoders decode one document of each kind the manifests use ("apiVersion
// kind") into its list in objects.
var decoders = map[string]func(o *objects, strict func(any) error) error{
	"v1 Namespace":                             func(o *objects, s func(any) error) error { return decodeAppend(s, &o.Namespaces) },
	"v1 ServiceAccount":                        func(o *objects, s func(any) error) error { return decodeAppend(s, &o.ServiceAccounts) },
	"v1 ConfigMap":                             func(o *objects, s func(any) error) error { return decodeAppend(s, &o.ConfigMaps) },
	"v1 Secret":                                func(o *objects, s func(any) error) error { return decodeAppend(s, &o.Secrets) },
	"v1 Service":                               func(o *objects, s func(any) error) error { return decodeAppend(s, &o.Services) },
	"apps/v1 Deployment":                       func(o *objects, s func(any) error) error { return decodeAppend(s, &o.Deployments) },
	"apps/v1 StatefulSet":                      func(o *objects, s func(any) error) error { return decodeAppend(s, &o.StatefulSets) },
	"autoscaling/v2 HorizontalPodAutoscaler":   func(o *objects, s func(any) error) error { return decodeAppend(s, &o.HPAs) },
	"policy/v1 PodDisruptionBudget":            func(o *objects, s func(any) error) error { return decodeAppend(s, &o.PDBs) },
	"networking.k8s.io/v1 NetworkPolicy":       func(o *objects, s func(any) error) error { return decodeAppend(s, &o.NetworkPolicies) },
	"rbac.authorization.k8s.io/v1 Role":        func(o *objects, s func(any) error) error { return decodeAppend(s, &o.Roles) },
	"rbac.authorization.k8s.io/v1 RoleBinding": func(o *objects, s func(any) error) error { return decodeAppend(s, &o.RoleBindings) },
	"http.keda.sh/v1alpha1 HTTPScaledObject":   func(o *objects, s func(any) error) error { return decodeAppend(s, &o.HTTPScaled) },
	"keda.sh/v1alpha1 ScaledObject":            func(o *objects, s func(any) error) error { return decodeAppend(s, &o.Scaled) },
	"keda.sh/v1alpha1 TriggerAuthentication":   func(o *objects, s func(any) error) error { return decodeAppend(s, &o.TriggerAuths) },
	"monitoring.coreos.com/v1 PrometheusRule":  func(o *objects, s func(any) error) error { return decodeAppend(s, &o.PrometheusRules) },
}

// knownKinds are the kinds in decoders, by kind alone (as kustomize's
// transformer configurations name them).
var knownKinds = func() map[string]bool {
	m := map[string]bool{}
	for k := range decoders {
		m[k[strings.LastIndex(k, " ")+1:]] = true
	}
	return m
}()

func (o *objects) addOne(doc []byte) error {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return err
	}
	decode, ok := decoders[tm.APIVersion+" "+tm.Kind]
	if !ok {
		return fmt.Errorf("apiVersion %q kind %q: not a kind these manifests use (add it to objects)", tm.APIVersion, tm.Kind)
	}
	err := decode(o, func(v any) error { return yaml.UnmarshalStrict(doc, v) })
	if err != nil {
		return fmt.Errorf("%s: %w", tm.Kind, err)
	}
	return nil
}

func decodeAppend[T any](strict func(any) error, list *[]T) error {
	var v T
	if err := strict(&v); err != nil {
		return err
	}
	*list = append(*list, v)
	return nil
}

var commentLine = regexp.MustCompile(`(?m)^\s*#.*$`)

func stripComments(b []byte) []byte { return commentLine.ReplaceAll(b, nil) }

type policyPDB = policyv1.PodDisruptionBudget

// workload is a Deployment or StatefulSet seen through what the checks need.
type workload struct {
	Kind     string
	Name     string
	Selector *metav1.LabelSelector
	Replicas *int32
	Template corev1.PodTemplateSpec
}

func (o *objects) workloads() []workload {
	var ws []workload
	for _, d := range o.Deployments {
		ws = append(ws, workload{"Deployment", d.Name, d.Spec.Selector, d.Spec.Replicas, d.Spec.Template})
	}
	for _, s := range o.StatefulSets {
		ws = append(ws, workload{"StatefulSet", s.Name, s.Spec.Selector, s.Spec.Replicas, s.Spec.Template})
	}
	return ws
}

func (o *objects) configMap(name string) *corev1.ConfigMap {
	for i := range o.ConfigMaps {
		if o.ConfigMaps[i].Name == name {
			return &o.ConfigMaps[i]
		}
	}
	return nil
}

func (o *objects) secret(name string) *corev1.Secret {
	for i := range o.Secrets {
		if o.Secrets[i].Name == name {
			return &o.Secrets[i]
		}
	}
	return nil
}

func (o *objects) service(name string) *corev1.Service {
	for i := range o.Services {
		if o.Services[i].Name == name {
			return &o.Services[i]
		}
	}
	return nil
}

func (o *objects) deployment(name string) *appsv1.Deployment {
	for i := range o.Deployments {
		if o.Deployments[i].Name == name {
			return &o.Deployments[i]
		}
	}
	return nil
}

func (o *objects) triggerAuth(name string) *triggerAuthentication {
	for i := range o.TriggerAuths {
		if o.TriggerAuths[i].Name == name {
			return &o.TriggerAuths[i]
		}
	}
	return nil
}
