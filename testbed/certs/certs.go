// Package certs writes a self-contained PKI and kubeconfigs for a local
// test-bed cluster (CA, apiserver serving cert, client certs for admin,
// controller-manager, scheduler, apiserver->kubelet, optional kubelets, and
// the service-account signing key).
package certs

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"flag"
	"fmt"
	"math"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/keyutil"
)

// Main implements `lbtestbed certs`. args[0] is the command name.
func Main(args []string) int {
	fs := flag.NewFlagSet("certs", flag.ExitOnError)
	dir := fs.String("dir", "", "output directory (required)")
	server := fs.String("server", "https://127.0.0.1:6443", "apiserver URL written into the kubeconfigs")
	extraIPs := fs.String("extra-ips", "", "comma-separated extra IP SANs for the apiserver serving cert (e.g. advertise address)")
	extraDNS := fs.String("extra-dns", "", "comma-separated extra DNS SANs for the apiserver serving cert")
	serviceIPs := fs.String("service-ips", "10.96.0.1,fd00:96::1", "comma-separated first IPs of the service CIDRs (added as SANs)")
	nodes := fs.String("nodes", "", "comma-separated node names: write kubelet-<node>.{crt,key,kubeconfig} (CN=system:node:<node>, O=system:nodes)")
	validity := fs.Duration("validity", 365*24*time.Hour, "leaf certificate validity")
	_ = fs.Parse(args[1:])
	if *dir == "" {
		fmt.Fprintln(os.Stderr, "certs: --dir is required")
		return 2
	}
	if err := generate(*dir, *server, splitList(*extraIPs), splitList(*extraDNS), splitList(*serviceIPs), splitList(*nodes), *validity); err != nil {
		fmt.Fprintf(os.Stderr, "certs: %v\n", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "certs: wrote PKI and kubeconfigs to %s\n", *dir)
	return 0
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

type issuer struct {
	cert *x509.Certificate
	key  crypto.Signer
}

func newKey() (*ecdsa.PrivateKey, error) { return ecdsa.GenerateKey(elliptic.P256(), rand.Reader) }

func serial() (*big.Int, error) { return rand.Int(rand.Reader, new(big.Int).SetInt64(math.MaxInt64)) }

// leaf signs a new ECDSA key pair with the CA and writes name.crt/name.key.
func (ca *issuer) leaf(dir, name string, subject pkix.Name, usage []x509.ExtKeyUsage, dnsNames []string, ips []net.IP, validity time.Duration) ([]byte, []byte, error) {
	key, err := newKey()
	if err != nil {
		return nil, nil, err
	}
	sn, err := serial()
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          sn,
		Subject:               subject,
		DNSNames:              dnsNames,
		IPAddresses:           ips,
		NotBefore:             now.Add(-5 * time.Minute).UTC(),
		NotAfter:              now.Add(validity).UTC(),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:           usage,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		return nil, nil, fmt.Errorf("sign %s: %w", name, err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, err
	}
	certPEM, err := cert.EncodeCertificates(c)
	if err != nil {
		return nil, nil, err
	}
	keyPEM, err := keyutil.MarshalPrivateKeyToPEM(key)
	if err != nil {
		return nil, nil, err
	}
	if err := cert.WriteCert(filepath.Join(dir, name+".crt"), certPEM); err != nil {
		return nil, nil, err
	}
	if err := keyutil.WriteKey(filepath.Join(dir, name+".key"), keyPEM); err != nil {
		return nil, nil, err
	}
	return certPEM, keyPEM, nil
}

func writeKubeconfig(path, server, user string, caPEM, certPEM, keyPEM []byte) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["testbed"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caPEM}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificateData: certPEM, ClientKeyData: keyPEM}
	cfg.Contexts["testbed"] = &clientcmdapi.Context{Cluster: "testbed", AuthInfo: user}
	cfg.CurrentContext = "testbed"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return err
	}
	return os.Chmod(path, 0o600)
}

func generate(dir, server string, extraIPs, extraDNS, serviceIPs, nodes []string, validity time.Duration) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}

	// CA (10 years, via client-go).
	caKey, err := newKey()
	if err != nil {
		return err
	}
	caCert, err := cert.NewSelfSignedCACert(cert.Config{CommonName: "lbtestbed-ca"}, caKey)
	if err != nil {
		return err
	}
	caPEM, err := cert.EncodeCertificates(caCert)
	if err != nil {
		return err
	}
	caKeyPEM, err := keyutil.MarshalPrivateKeyToPEM(caKey)
	if err != nil {
		return err
	}
	if err := cert.WriteCert(filepath.Join(dir, "ca.crt"), caPEM); err != nil {
		return err
	}
	if err := keyutil.WriteKey(filepath.Join(dir, "ca.key"), caKeyPEM); err != nil {
		return err
	}
	ca := &issuer{cert: caCert, key: caKey}

	// apiserver serving cert.
	dns := append([]string{"kubernetes", "kubernetes.default", "kubernetes.default.svc",
		"kubernetes.default.svc.cluster.local", "localhost"}, extraDNS...)
	ips := []net.IP{net.ParseIP("127.0.0.1"), net.IPv6loopback}
	for _, s := range append(append([]string{}, serviceIPs...), extraIPs...) {
		ip := net.ParseIP(s)
		if ip == nil {
			return fmt.Errorf("bad IP %q", s)
		}
		ips = append(ips, ip)
	}
	serverUsage := []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	client := []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	if _, _, err := ca.leaf(dir, "apiserver", pkix.Name{CommonName: "kube-apiserver"}, serverUsage, dns, ips, validity); err != nil {
		return err
	}

	// Client certs.
	type clientSpec struct {
		file, cn string
		orgs     []string
		kubecfg  bool
	}
	specs := []clientSpec{
		{"admin", "kubernetes-admin", []string{"system:masters"}, true},
		{"controller-manager", "system:kube-controller-manager", nil, true},
		{"scheduler", "system:kube-scheduler", nil, true},
		// Used by the apiserver for exec/logs/port-forward to kubelets
		// (--kubelet-client-certificate/--kubelet-client-key).
		{"apiserver-kubelet-client", "kube-apiserver-kubelet-client", []string{"system:masters"}, false},
	}
	for _, n := range nodes {
		specs = append(specs, clientSpec{"kubelet-" + n, "system:node:" + n, []string{"system:nodes"}, true})
	}
	for _, s := range specs {
		certPEM, keyPEM, err := ca.leaf(dir, s.file, pkix.Name{CommonName: s.cn, Organization: s.orgs}, client, nil, nil, validity)
		if err != nil {
			return err
		}
		if s.kubecfg {
			if err := writeKubeconfig(filepath.Join(dir, s.file+".kubeconfig"), server, s.cn, caPEM, certPEM, keyPEM); err != nil {
				return err
			}
		}
	}

	// Service-account signing key (RSA, as upstream) and its public half.
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	saPEM, err := keyutil.MarshalPrivateKeyToPEM(saKey)
	if err != nil {
		return err
	}
	if err := keyutil.WriteKey(filepath.Join(dir, "sa.key"), saPEM); err != nil {
		return err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return err
	}
	pubPEM := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER})
	return os.WriteFile(filepath.Join(dir, "sa.pub"), pubPEM, 0o644)
}
