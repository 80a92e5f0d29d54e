// fetch URL FILE: one GET with net/http's default client, as Go tools do.
package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
)

func main() {
	response, err := http.Get(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer response.Body.Close()
	if response.StatusCode != http.StatusOK {
		fmt.Fprintln(os.Stderr, "status", response.Status)
		os.Exit(1)
	}
	out, err := os.Create(os.Args[2])
	if err == nil {
		_, err = io.Copy(out, response.Body)
	}
	if err == nil {
		err = out.Close()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
