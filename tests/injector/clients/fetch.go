// fetch URL FILE [CAFILE]: one GET with net/http's default client, as Go tools do; with
// CAFILE, trusting the roots in it only, as a Go binary with roots of its own does (an
// x509.CertPool it made, never SSL_CERT_FILE).
package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
)

func fail(err error) {
	fmt.Fprintln(os.Stderr, err)
	os.Exit(1)
}

func client() *http.Client {
	if len(os.Args) < 4 {
		return http.DefaultClient
	}
	pem, err := os.ReadFile(os.Args[3])
	if err != nil {
		fail(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		fail(fmt.Errorf("no certificate in %s", os.Args[3]))
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.TLSClientConfig = &tls.Config{RootCAs: roots}
	return &http.Client{Transport: transport}
}

func main() {
	response, err := client().Get(os.Args[1])
	if err != nil {
		fail(err)
	}
	defer response.Body.Close()
	if response.StatusCode != http.StatusOK {
		fail(fmt.Errorf("status %s", response.Status))
	}
	out, err := os.Create(os.Args[2])
	if err == nil {
		_, err = io.Copy(out, response.Body)
	}
	if err == nil {
		err = out.Close()
	}
	if err != nil {
		fail(err)
	}
}
