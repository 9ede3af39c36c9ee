package k8s

import (
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// peer is one end of a connection as a NetworkPolicy sees it: a pod (its
// namespace's labels and its own, and its named ports) or an address
// outside the cluster.
type peer struct {
	ns, pod map[string]string
	ports   map[string]int32
	ip      netip.Addr
}

func nsLabels(name string) map[string]string {
	return map[string]string{"kubernetes.io/metadata.name": name}
}

// cellNSLabels are the labels of a cell's namespace (nats/<region> or
// overlays/<cell>/namespace): its name and its region.
func cellNSLabels(cell string) map[string]string {
	return map[string]string{"kubernetes.io/metadata.name": "assay-" + cell, "assay.dev/region": cells[cell]}
}

// across says whether from, in namespace fromNS under fromPols, may open
// a connection to to, in namespace toNS under toPols: the egress side
// decided by the source's namespace's policies, the ingress side by the
// destination's.
func across(fromPols map[string]*networkingv1.NetworkPolicy, fromNS string, from peer,
	toPols map[string]*networkingv1.NetworkPolicy, toNS string, to peer, port int32) bool {
	return direction(fromPols, fromNS, from, to, port, networkingv1.PolicyTypeEgress) &&
		direction(toPols, toNS, to, from, port, networkingv1.PolicyTypeIngress)
}

// allowed says whether the policies of namespace ns (where to or from
// lives) let from connect to to on TCP port, the way the API defines it: a
// pod that no policy of its direction selects is not isolated; an isolated
// one takes only what some selecting policy's rule allows.
func allowed(pols map[string]*networkingv1.NetworkPolicy, nsName string, from, to peer, port int32) bool {
	return direction(pols, nsName, from, to, port, networkingv1.PolicyTypeEgress) &&
		direction(pols, nsName, to, from, port, networkingv1.PolicyTypeIngress)
}

// direction checks one side: self is the pod the policies select (the
// source for egress, the destination for ingress), other the far end.
func direction(pols map[string]*networkingv1.NetworkPolicy, nsName string, self, other peer, port int32, kind networkingv1.PolicyType) bool {
	if self.pod == nil || self.ns["kubernetes.io/metadata.name"] != nsName {
		return true // not a pod of this namespace: its own policies are not these
	}
	isolated := false
	for _, np := range pols {
		sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		if err != nil || !sel.Matches(labels.Set(self.pod)) || !slices.Contains(policyTypes(np), kind) {
			continue
		}
		isolated = true
		if kind == networkingv1.PolicyTypeEgress {
			for _, r := range np.Spec.Egress {
				if portsMatch(r.Ports, other.ports, port) && peersMatch(r.To, other, nsName) {
					return true
				}
			}
		} else {
			for _, r := range np.Spec.Ingress {
				if portsMatch(r.Ports, self.ports, port) && peersMatch(r.From, other, nsName) {
					return true
				}
			}
		}
	}
	return !isolated
}

func policyTypes(np *networkingv1.NetworkPolicy) []networkingv1.PolicyType {
	if len(np.Spec.PolicyTypes) > 0 {
		return np.Spec.PolicyTypes
	}
	out := []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	if len(np.Spec.Egress) > 0 {
		out = append(out, networkingv1.PolicyTypeEgress)
	}
	return out
}

// portsMatch: no ports is every port; a named port is resolved on the
// destination pod.
func portsMatch(ps []networkingv1.NetworkPolicyPort, named map[string]int32, port int32) bool {
	if len(ps) == 0 {
		return true
	}
	for _, p := range ps {
		if p.Protocol != nil && *p.Protocol != corev1.ProtocolTCP {
			continue
		}
		switch {
		case p.Port == nil:
			return true
		case p.Port.IntValue() == int(port) && p.Port.IntValue() != 0:
			return true
		case p.Port.IntValue() == 0 && named[p.Port.String()] == port:
			return true
		case p.EndPort != nil && int32(p.Port.IntValue()) <= port && port <= *p.EndPort:
			return true
		}
	}
	return false
}

func peersMatch(ps []networkingv1.NetworkPolicyPeer, other peer, nsName string) bool {
	if len(ps) == 0 {
		return true
	}
	for _, p := range ps {
		if p.IPBlock != nil {
			if other.pod == nil && inBlock(p.IPBlock, other.ip) {
				return true
			}
			continue
		}
		if other.pod == nil {
			continue
		}
		nsOK := other.ns["kubernetes.io/metadata.name"] == nsName
		if p.NamespaceSelector != nil {
			sel, err := metav1.LabelSelectorAsSelector(p.NamespaceSelector)
			nsOK = err == nil && sel.Matches(labels.Set(other.ns))
		}
		podOK := true
		if p.PodSelector != nil {
			sel, err := metav1.LabelSelectorAsSelector(p.PodSelector)
			podOK = err == nil && sel.Matches(labels.Set(other.pod))
		}
		if nsOK && podOK {
			return true
		}
	}
	return false
}

func inBlock(b *networkingv1.IPBlock, ip netip.Addr) bool {
	cidr, err := netip.ParsePrefix(b.CIDR)
	if err != nil || !cidr.Contains(ip) {
		return false
	}
	for _, e := range b.Except {
		if ex, err := netip.ParsePrefix(e); err == nil && ex.Contains(ip) {
			return false
		}
	}
	return true
}

// checkPolicies: every policy selects some pod it is for; every service and
// the migration Job resolve names and reach the cell's Postgres, the four
// services reach NATS's client port; only the classifier (the provider),
// ingress (diffs) and the committer (publication, and callbacks on any
// port) reach out, over IPv4 and IPv6 alike; the metrics ports take only
// Prometheus, the NATS servers and the Postgres instances only who needs
// them (nats holds the NATS policies, rendered by nats/<cell>).
func checkPolicies(t *testing.T, s, nats *set, cell string, everyOneSelects bool) {
	t.Helper()
	ns, natsNS := "assay-"+cell, "assay-"+cells[cell]
	here := cellNSLabels(cell)
	pg := peer{ns: here, pod: map[string]string{"cnpg.io/cluster": "assay-pg", "cnpg.io/instanceRole": "primary", "cnpg.io/podRole": "instance"}}
	// The region's NATS, in its first cell's namespace.
	natsPod := peer{ns: cellNSLabels(cells[cell]), pod: map[string]string{"app.kubernetes.io/name": "nats", "app.kubernetes.io/instance": "nats", "app.kubernetes.io/component": "nats"}}
	// A cell on one node (overlays/trial) renders its own Postgres instance
	// and NATS server: their pods are the ones its manifests make.
	cnpg := true
	if x := nats.statefulSets["assay-pg"]; x != nil {
		pg.pod, cnpg = x.Spec.Template.Labels, false
	}
	if x := nats.statefulSets["nats"]; x != nil {
		natsPod.pod = x.Spec.Template.Labels
	}
	dns := peer{ns: nsLabels("kube-system"), pod: map[string]string{"k8s-app": "kube-dns"}}
	stranger := peer{ns: nsLabels("elsewhere"), pod: map[string]string{"app": "anything"}}
	prometheus := peer{ns: nsLabels("monitoring"), pod: map[string]string{"app.kubernetes.io/name": "prometheus"}}
	keda := peer{ns: nsLabels("keda"), pod: map[string]string{"app": "keda-operator"}}
	cnpgOperator := peer{ns: nsLabels("cnpg-system"), pod: map[string]string{"app.kubernetes.io/name": "cloudnative-pg"}}
	outside := []peer{{ip: netip.MustParseAddr("203.0.113.7")}, {ip: netip.MustParseAddr("2001:db8::7")}}
	private := []peer{{ip: netip.MustParseAddr("10.1.2.3")}, {ip: netip.MustParseAddr("fd00::3")}, {ip: netip.MustParseAddr("169.254.169.254")}}

	if _, ok := s.policies["assay-default-deny"]; !ok {
		t.Errorf("%s: no default-deny policy", s.dir)
	}
	pods := podSpecs(s)
	var assayPods []peer
	for _, p := range pods {
		ports := map[string]int32{}
		for _, c := range p.Spec.Containers {
			for _, cp := range c.Ports {
				ports[cp.Name] = cp.ContainerPort
			}
		}
		assayPods = append(assayPods, peer{ns: here, pod: p.Labels, ports: ports})
	}
	candidates := append(slices.Clone(assayPods), pg)
	if s == nats {
		candidates = append(candidates, natsPod)
	}
	for name, np := range s.policies {
		sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		any := false
		for _, p := range candidates {
			any = any || (err == nil && sel.Matches(labels.Set(p.pod)))
		}
		if !any && everyOneSelects {
			t.Errorf("%s: NetworkPolicy %s selects no pod", s.dir, name)
		}
	}
	for _, p := range assayPods {
		name := p.pod["app.kubernetes.io/name"]
		if !allowed(s.policies, ns, p, dns, 53) {
			t.Errorf("%s: %s cannot resolve names", s.dir, name)
		}
		if !allowed(s.policies, ns, p, pg, 5432) {
			t.Errorf("%s: %s cannot reach its cell's Postgres", s.dir, name)
		}
		isService := slices.Contains(services, name)
		if got := across(s.policies, ns, p, nats.policies, natsNS, natsPod, 4222); got != isService {
			t.Errorf("%s: %s reaches the region's NATS (%s): %v, want %v", s.dir, name, nats.dir, got, isService)
		}
		// The region's cells send requests on to each other's ingress
		// (ASSAY_CELL_URL); no other pod goes there, and no cell of
		// another region is reached.
		for other, region := range cells {
			theirs := peer{ns: cellNSLabels(other), pod: map[string]string{"app.kubernetes.io/name": "ingress", "app.kubernetes.io/part-of": "assay"},
				ports: map[string]int32{"http": 8080}}
			want := name == "ingress" && region == cells[cell]
			if got := across(s.policies, ns, p, s.policies, "assay-"+other, theirs, 8080); got != want {
				t.Errorf("%s: %s reaches the ingress of cell %s: %v, want %v", s.dir, name, other, got, want)
			}
		}
		wantOut := name == "classifier" || name == "ingress" || name == "committer"
		for _, o := range outside {
			if got := allowed(s.policies, ns, p, o, 443); got != wantOut {
				t.Errorf("%s: %s reaches HTTPS at %s: %v, want %v", s.dir, name, o.ip, got, wantOut)
			}
			if got := allowed(s.policies, ns, p, o, 8443); got != (name == "committer") {
				t.Errorf("%s: %s reaches %s:8443: %v, want it for the committer's callbacks only", s.dir, name, o.ip, got)
			}
		}
		for _, o := range private {
			if allowed(s.policies, ns, p, o, 443) {
				t.Errorf("%s: %s reaches the private address %s", s.dir, name, o.ip)
			}
		}
		if met, ok := p.ports["metrics"]; isService && (!ok || !allowed(s.policies, ns, prometheus, p, met) || allowed(s.policies, ns, stranger, p, met)) {
			t.Errorf("%s: %s: its metrics port %d must take Prometheus and no one else", s.dir, name, met)
		}
		if h, ok := p.ports["http"]; isService && ok && allowed(s.policies, ns, stranger, p, h) != (name == "ingress") {
			t.Errorf("%s: %s: its http port takes other namespaces: %v, want it for the ingress API only", s.dir, name, !(name == "ingress"))
		}
	}
	if !everyOneSelects {
		return
	}
	// The cell's Postgres, with this overlay's policies.
	svc := assayPods[0]
	for _, c := range []struct {
		what     string
		from     peer
		port     int32
		allowed  bool
		policies map[string]*networkingv1.NetworkPolicy
		to       peer
		cnpgOnly bool // the CloudNativePG instances' own ports
	}{
		{"Postgres from an assay pod", svc, 5432, true, s.policies, pg, false},
		{"Postgres from another instance", pg, 5432, true, s.policies, pg, true},
		{"Postgres from another namespace", stranger, 5432, false, s.policies, pg, false},
		{"the instance manager from the operator", cnpgOperator, 8000, true, s.policies, pg, true},
		{"the instance manager from another namespace", stranger, 8000, false, s.policies, pg, false},
		{"Postgres metrics from Prometheus", prometheus, 9187, true, s.policies, pg, true},
		{"Postgres from the NATS servers", natsPod, 5432, false, s.policies, pg, false},
	} {
		if c.cnpgOnly && !cnpg {
			continue
		}
		if got := allowed(c.policies, ns, c.from, c.to, c.port); got != c.allowed {
			t.Errorf("%s: %s (port %d): allowed %v, want %v", s.dir, c.what, c.port, got, c.allowed)
		}
	}
	// The region's NATS, with its kustomization's policies; a cell of the
	// region it does not serve (us-2 under nats/us) is a stranger to it.
	otherCell := peer{ns: cellNSLabels("us-2"), pod: map[string]string{"app.kubernetes.io/name": "classifier", "app.kubernetes.io/part-of": "assay"}}
	serves := slices.ContainsFunc(natsKustomizations, func(k natsKustomization) bool {
		return k.dir == nats.dir && slices.Contains(k.cells, "us-2")
	})
	for _, c := range []struct {
		what    string
		from    peer
		port    int32
		allowed bool
	}{
		{"NATS clients from another namespace", stranger, 4222, false},
		{"NATS clients from the us-2 cell", otherCell, 4222, serves},
		{"NATS monitoring from KEDA", keda, 8222, true},
		{"NATS monitoring from another namespace", stranger, 8222, false},
		{"NATS monitoring from an assay pod", svc, 8222, false},
		{"NATS routes from another server", natsPod, 6222, true},
		{"NATS routes from another namespace", stranger, 6222, false},
		{"the NATS exporter from Prometheus", prometheus, 7777, true},
		{"the NATS exporter from another namespace", stranger, 7777, false},
	} {
		if got := direction(nats.policies, natsNS, natsPod, c.from, c.port, networkingv1.PolicyTypeIngress); got != c.allowed {
			t.Errorf("%s: %s (port %d): allowed %v, want %v", nats.dir, c.what, c.port, got, c.allowed)
		}
	}
}
