// grpc TARGET: one unary call of /burstbuffer.test.Echo/Say with grpc-go, printing the
// reply. TLS with the system's roots and grpc-go's own dialer, which honours
// `https_proxy` (HTTP CONNECT) by itself, as any grpc-go program does. The method takes
// and returns raw bytes, so a codec that passes them through stands in for generated stubs.
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

type rawCodec struct{}

func (rawCodec) Marshal(v interface{}) ([]byte, error) { return *v.(*[]byte), nil }

func (rawCodec) Unmarshal(data []byte, v interface{}) error {
	*v.(*[]byte) = append([]byte(nil), data...)
	return nil
}

// Sent as the content-subtype ("application/grpc+proto"): the server's generic handler
// takes the bytes as they are, and "proto" is what a stub's call would announce.
func (rawCodec) Name() string { return "proto" }

func main() {
	conn, err := grpc.Dial(os.Args[1], grpc.WithTransportCredentials(credentials.NewClientTLSFromCert(nil, "")))
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		request, reply := []byte("hello"), []byte(nil)
		err = conn.Invoke(ctx, "/burstbuffer.test.Echo/Say", &request, &reply, grpc.ForceCodec(rawCodec{}))
		if err == nil {
			fmt.Println(string(reply))
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
